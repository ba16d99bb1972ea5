// ModelLayout of TorchScript modules, cached (see NOTE [Model layouts]).
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/script.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "torchlens_dispatch/layout_builder.h"
#include "torchlens_dispatch/model_layout.h"
#include "torchlens_dispatch/source_positions.h"

namespace torchlens {
namespace {

using AssignedAttributes = absl::flat_hash_set<std::pair<const c10::ClassType*, std::string>>;

std::string TypeName(const c10::ClassType& type) {
  return ShortTypeName(type.name() ? type.name()->qualifiedName() : std::string("Module"));
}

// NOTE [Forked work]
// `torch.jit.fork` runs a function on one of the interpreter's other threads (`prim::fork`,
// joined by `aten::wait`). The capture key is thread-local, so the forked ops would be
// missing from the trace, and how much of the forward ran on the capturing thread before
// the join would differ from run to run: a partial trace that looks complete. Capturing
// work on other threads would need the key carried into the interpreter's thread pool,
// which LibTorch 1.13 gives no hook for. A model whose code forks is therefore refused:
// the layout records the first fork (or wait) in the code its module methods can reach,
// following calls into free functions and methods of other classes, and CaptureGuard
// reports it before anything runs.

// What the model's TorchScript code does that the capture must know before it runs: the
// buffers its module methods reassign (prim::SetAttr), and where it forks.
class CodeScan {
 public:
  // Scans each method of `type` (a module's class) once.
  void ModuleType(const c10::ClassType& type) {
    if (!types_.insert(&type).second) return;
    for (torch::jit::Function* method : type.methods()) {
      Function(*method, absl::StrCat(TypeName(type), ".", method->name()), /*module=*/true);
    }
  }

  AssignedAttributes assigned;
  std::string fork;  // "Net.forward forks at code/__torch__.py:9: ...", or empty

 private:
  void Function(torch::jit::Function& function, const std::string& name, bool module) {
    if (!function.isGraphFunction() || !functions_.insert(&function).second) return;
    Block(torch::jit::toGraphFunction(function).graph()->block(), name, module);
  }

  void Block(const torch::jit::Block* block, const std::string& name, bool module) {
    for (const torch::jit::Node* node : block->nodes()) {
      const c10::Symbol kind = node->kind();
      if (kind == c10::prim::SetAttr && module) {
        if (auto type = node->input(0)->type()->cast<c10::ClassType>()) {
          assigned.emplace(type.get(), node->s(c10::attr::name));
        }
      } else if ((kind == c10::prim::fork || kind == c10::prim::forkClosure ||
                  kind == c10::aten::wait) &&
                 fork.empty()) {
        fork = absl::StrCat(name, " ", kind == c10::aten::wait ? "waits for forked work" : "forks");
        // The model's Python line, as other errors give it, when the archive has debug
        // information; its compiled code's otherwise.
        if (std::shared_ptr<const SourcePosition> place = SourcePositionOf(node->sourceRange())) {
          absl::StrAppend(&fork, " at ", place->file, ":", place->line, ": ", place->text);
        }
      } else if (kind == c10::prim::CallFunction) {
        if (auto callee = node->input(0)->type()->cast<c10::FunctionType>()) {
          Function(*callee->function(), callee->function()->name(), false);
        }
      } else if (kind == c10::prim::CallMethod) {
        auto type = node->input(0)->type()->cast<c10::ClassType>();
        if (type && !type->is_module()) {
          if (torch::jit::Function* method = type->findMethod(node->s(c10::attr::name))) {
            Function(*method, absl::StrCat(TypeName(*type), ".", method->name()), false);
          }
        }
      }
      for (const torch::jit::Block* inner : node->blocks()) Block(inner, name, module);
    }
  }

  absl::flat_hash_set<const c10::ClassType*> types_;
  absl::flat_hash_set<const torch::jit::Function*> functions_;
};

std::string Join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : absl::StrCat(prefix, ".", name);
}

// One walk over the object tree in attribute-slot order.
void Walk(const c10::intrusive_ptr<c10::ivalue::Object>& object, const std::string& address,
          ModelLayout* layout, std::vector<std::pair<std::string, std::string>>* modules,
          CodeScan* scan) {
  const c10::ClassTypePtr type = object->type();
  scan->ModuleType(*type);
  modules->emplace_back(address, TypeName(*type));
  const size_t attributes = type->numAttributes();
  layout->checks.push_back(ModelLayout::SlotCheck{
      object.get(), SIZE_MAX, reinterpret_cast<const void*>(object->slots().size())});
  for (size_t slot = 0; slot < attributes; ++slot) {
    const c10::IValue& value = object->getSlot(slot);
    if (type->is_parameter(slot)) {
      if (value.isTensor()) {
        layout->params.push_back(ModelLayout::ParamEntry{
            Join(address, type->getAttributeName(slot)), 0, value.toTensor(), at::Tensor()});
        layout->checks.push_back(
            ModelLayout::SlotCheck{object.get(), slot, value.unsafeToTensorImpl()});
      }
    } else if (type->is_buffer(slot)) {
      if (value.isTensor()) {
        ModelLayout::BufferEntry buffer;
        buffer.address = Join(address, type->getAttributeName(slot));
        buffer.owner = object.get();
        buffer.slot = slot;
        layout->buffers.push_back(std::move(buffer));
      }
    } else if (type->getAttribute(slot)->is_module() && value.isObject()) {
      layout->checks.push_back(ModelLayout::SlotCheck{object.get(), slot, &value.toObjectRef()});
      Walk(value.toObject(), Join(address, type->getAttributeName(slot)), layout, modules, scan);
    } else if (value.isTensor()) {
      layout->tensor_attributes.push_back(ModelLayout::AttributeEntry{
          Join(address, type->getAttributeName(slot)), object.get(), slot});
    }
  }
}

std::shared_ptr<const ModelLayout> Read(const torch::jit::Module& model) {
  auto layout = std::make_shared<ModelLayout>();
  layout->torchscript = true;
  std::vector<std::pair<std::string, std::string>> modules;
  CodeScan scan;
  Walk(model._ivalue(), "", layout.get(), &modules, &scan);
  for (ModelLayout::BufferEntry& buffer : layout->buffers) {
    const c10::ClassTypePtr type = buffer.owner->type();
    buffer.assigned_in_code =
        scan.assigned.contains({type.get(), type->getAttributeName(buffer.slot)});
  }
  layout->forked_work = std::move(scan.fork);
  FinishLayout(std::move(modules), layout.get());
  return layout;
}

// Whether `layout` still describes the model: the same objects holding the same
// submodules and parameter tensors, with the same number of attributes. No allocation.
// The objects are scattered over the heap and cold when a capture starts, so the loop
// prefetches two levels ahead (each object, then the slot it checks): a model of 4,000
// modules then checks in a fraction of the time a miss per step would take. A check is a
// few nanoseconds of work, so the prefetches run 32 checks (8 modules) ahead, which was
// faster than 8 on large models.
bool Matches(const ModelLayout& layout, const c10::ivalue::Object* root) {
  if (layout.checks.empty() || layout.checks.front().object != root) return false;
  constexpr size_t kAhead = 32;
  const std::vector<ModelLayout::SlotCheck>& checks = layout.checks;
  for (size_t i = 0; i < checks.size(); ++i) {
    if (i + 2 * kAhead < checks.size()) {
      __builtin_prefetch(&checks[i + 2 * kAhead].object->slots());  // no load: a member's address
    }
    if (i + kAhead < checks.size()) {
      const ModelLayout::SlotCheck& ahead = checks[i + kAhead];
      const std::vector<c10::IValue>& ahead_slots = ahead.object->slots();
      if (ahead.slot < ahead_slots.size()) __builtin_prefetch(&ahead_slots[ahead.slot]);
    }
    const ModelLayout::SlotCheck& check = checks[i];
    const std::vector<c10::IValue>& slots = check.object->slots();
    if (check.slot == SIZE_MAX) {
      if (reinterpret_cast<const void*>(slots.size()) != check.expected) return false;
      continue;
    }
    if (check.slot >= slots.size()) return false;
    const c10::IValue& value = slots[check.slot];
    const void* actual = value.isTensor()   ? static_cast<const void*>(value.unsafeToTensorImpl())
                         : value.isObject() ? static_cast<const void*>(&value.toObjectRef())
                                            : nullptr;
    if (actual != check.expected) return false;
  }
  return true;
}

class LayoutCache {
 public:
  std::shared_ptr<const ModelLayout> Get(const torch::jit::Module& model) {
    const c10::ivalue::Object* root = model._ivalue().get();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (Entry& entry : entries_) {
        if (entry.root.expired() || entry.root_address != root) continue;
        if (Matches(*entry.layout, root)) return entry.layout;
      }
    }
    std::shared_ptr<const ModelLayout> layout = Read(model);
    std::lock_guard<std::mutex> lock(mutex_);
    // Forget models that died, and the oldest beyond the bound.
    entries_.erase(
        std::remove_if(entries_.begin(), entries_.end(),
                       [&](const Entry& e) { return e.root.expired() || e.root_address == root; }),
        entries_.end());
    if (entries_.size() >= kMaxModels) entries_.erase(entries_.begin());
    entries_.push_back(
        Entry{c10::weak_intrusive_ptr<c10::ivalue::Object>(model._ivalue()), root, layout});
    return layout;
  }

 private:
  static constexpr size_t kMaxModels = 16;
  struct Entry {
    c10::weak_intrusive_ptr<c10::ivalue::Object> root;
    const c10::ivalue::Object* root_address;
    std::shared_ptr<const ModelLayout> layout;
  };
  std::mutex mutex_;
  std::vector<Entry> entries_;
};

}  // namespace

std::shared_ptr<const ModelLayout> LayoutOf(const torch::jit::Module& model) {
  static LayoutCache* cache = new LayoutCache();  // used until exit
  return cache->Get(model);
}

}  // namespace torchlens
