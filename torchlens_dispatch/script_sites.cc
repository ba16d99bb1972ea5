#include "torchlens_dispatch/script_sites.h"

#include <torch/csrc/jit/runtime/interpreter.h>

#include "absl/hash/hash.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"

namespace torchlens {

int32_t ModuleAddresses::Intern(const std::string& address) {
  if (auto it = base_ids_->find(address); it != base_ids_->end()) return it->second;
  const int32_t next = static_cast<int32_t>(base_->size() + extra_.size());
  auto [it, inserted] = extra_ids_.emplace(address, next);
  if (inserted) extra_.push_back(address);
  return it->second;
}

int32_t ModuleAddresses::Step(int32_t current, const std::string& instance,
                              const std::string& type) {
  const std::vector<std::string>& addresses = *tree_.addresses;
  // A direct child's address is its parent's plus its name: one hash lookup, so resolving
  // a site does not grow with the number of siblings (2,000 layers in one Sequential).
  std::string child_address;
  auto child_named = [&](int32_t parent) -> int32_t {
    child_address = parent == 0 ? instance : absl::StrCat(addresses[parent], ".", instance);
    auto it = tree_.ids->find(child_address);
    if (it == tree_.ids->end() || (*tree_.types)[it->second] != type) return -1;
    return it->second;
  };
  int32_t next = child_named(current);
  if (next >= 0) return next;
  // Through a container child: self.convs[0] is "convs.0".
  for (int32_t container : (*tree_.children)[current]) {
    const std::string& container_type = (*tree_.types)[container];
    if (container_type != "ModuleList" && container_type != "ModuleDict" &&
        container_type != "Sequential") {
      continue;
    }
    const int32_t found = child_named(container);
    if (found >= 0) {
      if (next >= 0) return -1;  // two containers hold such a module: ambiguous
      next = found;
    }
  }
  return next;
}

int32_t ModuleAddresses::Resolve(const std::vector<std::pair<std::string, std::string>>& path,
                                 bool* unresolved) {
  int32_t current = 0;
  for (const auto& [instance, type] : path) {
    const int32_t next = Step(current, instance, type);
    if (next < 0) {
      *unresolved = true;
      return current;
    }
    current = next;
  }
  return current;
}

int32_t ModuleAddresses::Resolve(const SitePath* path, bool* unresolved) {
  // NOTE [Site paths]: walk up to the root or to a node resolved against this tree, then
  // resolve the nodes below it in turn, caching each.
  const uint64_t serial = tree_.serial;
  std::vector<const SitePath*> pending;
  uint64_t known = 0;  // (unresolved << 31) | module of the deepest cached ancestor
  for (const SitePath* node = path; node != nullptr; node = node->parent) {
    const uint64_t cached = node->resolved.load();
    if (cached >> 32 == serial) {
      known = cached & 0xffffffff;
      break;
    }
    pending.push_back(node);
  }
  for (auto it = pending.rbegin(); it != pending.rend(); ++it) {
    if ((known >> 31 & 1) == 0) {  // an unresolved step stops the descent
      const int32_t next = Step(static_cast<int32_t>(known), (*it)->instance, (*it)->type);
      known = next < 0 ? (uint64_t{1} << 31 | known) : static_cast<uint32_t>(next);
    }
    (*it)->resolved.store(serial << 32 | known);
  }
  *unresolved = (known >> 31 & 1) != 0;
  return static_cast<int32_t>(known & 0x7fffffff);
}

HierarchyEntry ClassifyHierarchyEntry(absl::string_view entry, absl::string_view previous) {
  // Entries look like "TOP(Net)::forward", "block(Block)::forward",
  // "SELF(Conv2d)::_conv_forward", "CALL_FUNCTION::relu()::relu" or "::helper". Only named
  // instances descend. A method that a module calls on itself shows as SELF, or, depending
  // on the order in which the inliner met the calls, under the module's own instance name
  // and type again ("stem(Conv2d)::forward | stem(Conv2d)::_conv_forward"): both stay in
  // the module. The same instance, type and method again cannot be the module calling
  // itself (TorchScript has no recursion): it is a submodule of the same name and type
  // ("inner(Wrap)::forward | inner(Wrap)::forward", modules nested in each other).
  HierarchyEntry result;
  const size_t paren = entry.find('(');
  const size_t close = entry.find(')');
  if (paren == 0 || paren == absl::string_view::npos || close == absl::string_view::npos) {
    return result;  // a free function
  }
  const absl::string_view instance = entry.substr(0, paren);
  if (instance == "INSTANCE_NAME_UNKNOWN") {
    result.kind = HierarchyEntry::Kind::kUnknownInstance;
    return result;
  }
  const absl::string_view instance_and_type = entry.substr(0, close + 1);
  if (instance == "SELF" || absl::StartsWith(instance, "CALL_FUNCTION") ||
      (absl::StartsWith(previous, instance_and_type) && previous != entry)) {
    return result;
  }
  result.kind = HierarchyEntry::Kind::kEnters;
  result.instance = std::string(instance);
  result.type = std::string(entry.substr(paren + 1, close - paren - 1));
  return result;
}

ParsedHierarchy ParseModuleHierarchy(const std::vector<std::string>& hierarchy) {
  ParsedHierarchy parsed;
  std::vector<absl::string_view> path;
  absl::string_view previous;
  for (size_t i = 1; i < hierarchy.size(); ++i) {
    HierarchyEntry entry = ClassifyHierarchyEntry(hierarchy[i], previous);
    if (entry.kind == HierarchyEntry::Kind::kUnknownInstance) parsed.unknown_instance = true;
    if (entry.kind != HierarchyEntry::Kind::kEnters) continue;
    previous = hierarchy[i];
    parsed.path.emplace_back(std::move(entry.instance), std::move(entry.type));
    parsed.innermost = i;
    parsed.unknown_instance = false;
  }
  for (const auto& [instance, type] : parsed.path) path.push_back(instance);
  parsed.address = absl::StrJoin(path, ".");
  return parsed;
}

namespace {
thread_local const MarkedSite* marked_site = nullptr;
}  // namespace

void SetMarkedSite(const MarkedSite* site) {
  __builtin_prefetch(site);  // read after the op ran (ScriptSites::Current)
  marked_site = site;
}

const MarkedSite* TakeMarkedSite() {
  const MarkedSite* site = marked_site;
  marked_site = nullptr;
  return site;
}

uint64_t MixPosition(uint64_t hash, const torch::jit::SourceRange& range) {
  return absl::HashOf(hash, range.start(), range.end(),
                      static_cast<const void*>(range.source().get()));
}

ScriptSite ScriptSites::Current(c10::Symbol op) {
  // See NOTE [Site markers].
  if (const MarkedSite* marked = TakeMarkedSite(); marked != nullptr && marked->op == op) {
    const uint64_t serial = addresses_->tree_serial();
    uint64_t resolved = marked->resolved.load();
    if (resolved >> 32 != serial) {
      bool unresolved = false;
      const int32_t module = addresses_->Resolve(marked->path, &unresolved);
      resolved =
          serial << 32 | static_cast<uint64_t>(unresolved) << 31 | static_cast<uint32_t>(module);
      marked->resolved.store(resolved);
    }
    const int32_t module = static_cast<int32_t>(resolved & 0x7fffffff);
    const bool unresolved = marked->unknown_instance || (resolved >> 31 & 1) != 0;
    ++marked_;
    ScriptSite site{true, module, marked->position, unresolved};
    site.marked = marked;
    if (!unresolved) {
      // See NOTE [Layer classes].
      uint64_t layer_class = marked->layer_class.load();
      if (layer_class >> 32 != serial) {
        layer_class = serial << 32 | static_cast<uint32_t>(addresses_->layer_classes()->Number(
                                         module, marked->op, marked->position));
        marked->layer_class.store(layer_class);
      }
      site.layer_class = static_cast<int32_t>(layer_class & 0xffffffff);
    }
    return site;
  }
  ScriptSite site = FromInterpreter();
  asked_ += site.in_script ? 1 : 0;
  return site;
}

ScriptSite ScriptSites::FromInterpreter() {
  ScriptSite site;
  std::vector<std::string> hierarchy = torch::jit::currentModuleHierarchy();
  if (hierarchy.empty()) return site;
  site.in_script = true;
  if (hierarchy != last_hierarchy_) {
    ParsedHierarchy parsed = ParseModuleHierarchy(hierarchy);
    last_innermost_ = parsed.innermost;
    last_unknown_ = parsed.unknown_instance;
    last_module_ = addresses_->Resolve(parsed.path, &last_unknown_);
    last_hierarchy_ = std::move(hierarchy);
  }
  site.module = last_module_;
  site.unknown_instance = last_unknown_;
  // currentCallstack() is innermost first; entry k from the outside is the range executing
  // in the function of hierarchy entry k.
  const std::vector<torch::jit::StackEntry> stack = torch::jit::currentCallstack();
  const size_t first = stack.size() == last_hierarchy_.size() ? last_innermost_ : 0;
  uint64_t position = kPositionSeed;
  for (size_t k = first; k < stack.size(); ++k) {
    position = MixPosition(position, stack[stack.size() - 1 - k].range);
  }
  site.position = position;
  last_range_ = stack.empty() ? torch::jit::SourceRange() : stack.front().range;
  return site;
}

const SourcePosition* ScriptSites::PositionOf(
    const ScriptSite& site, std::vector<std::shared_ptr<const void>>* owners) const {
  if (!site.in_script) return nullptr;
  if (site.marked != nullptr) {
    const std::shared_ptr<const void>& owner = *site.marked->source_position_owner;
    if (owners->empty() || owners->back() != owner) owners->push_back(owner);
    return site.marked->source_position;
  }
  std::shared_ptr<const SourcePosition> position = SourcePositionOf(last_range_);
  const SourcePosition* unowned = position.get();
  if (unowned != nullptr) owners->push_back(std::move(position));
  return unowned;
}

}  // namespace torchlens
