#include "graph/render_groups.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace torchlens {
namespace {

// The module a node is drawn inside, at the depth limit; "" when it is drawn as itself.
absl::string_view CollapsedModule(const Op& op, int max_module_depth) {
  if (max_module_depth < 1 || op.is_input() || op.is_output()) return {};
  absl::string_view address = op.module_address;
  if (ModuleDepth(address) < max_module_depth) return {};
  int dots = 0;
  for (size_t k = 0; k < address.size(); ++k) {
    if (address[k] == '.' && ++dots == max_module_depth) return address.substr(0, k);
  }
  return address;  // exactly max_module_depth levels deep
}

// The label without its pass: "relu_1_2:3" -> "relu_1_2", "buffer_1:2" -> "buffer_1".
absl::string_view LayerOfLabel(absl::string_view label) {
  const size_t colon = label.rfind(':');
  return colon == absl::string_view::npos ? label : label.substr(0, colon);
}

}  // namespace

int ModuleDepth(absl::string_view address) {
  if (address.empty()) return 0;
  return static_cast<int>(std::count(address.begin(), address.end(), '.')) + 1;
}

RenderGrouping GroupForRender(const Trace& trace, int max_module_depth, bool rolled) {
  const std::vector<Op>& ops = trace.ops();
  RenderGrouping grouping;
  grouping.group_of.assign(ops.size(), -1);
  absl::flat_hash_map<std::string, int> by_key;       // rolled layers and rolled modules
  absl::flat_hash_map<std::string, int> latest_call;  // collapsed module -> its last group
  absl::flat_hash_map<std::string, int> calls;        // collapsed module -> calls so far
  // The call being drawn: its module and the layer that began it (NOTE [Module calls]).
  std::string open_module;
  int open_first_layer = -1;

  auto add = [&](RenderGroup group) {
    grouping.groups.push_back(std::move(group));
    return static_cast<int>(grouping.groups.size()) - 1;
  };
  auto keyed = [&](const std::string& key, RenderGroup group) {
    auto [it, inserted] = by_key.try_emplace(key, -1);
    if (inserted) it->second = add(std::move(group));
    return it->second;
  };

  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    const int index = static_cast<int>(i);
    const std::string module(CollapsedModule(op, max_module_depth));
    int group = -1;
    if (!module.empty() && op.is_compute()) {
      const bool continues = module == open_module && op.layer_step_index != open_first_layer;
      if (!continues) {
        open_module = module;
        open_first_layer = op.layer_step_index;
        const int call = ++calls[module];
        RenderGroup box{RenderGroup::Kind::kModule, index, module};
        if (rolled) {
          group = keyed(absl::StrCat("module:", module), box);
          ++grouping.groups[group].passes;
        } else {
          box.passes = 1;
          box.call = call;
          group = add(std::move(box));
        }
        latest_call[module] = group;
      } else {
        group = latest_call[module];
      }
    } else if (!module.empty() && latest_call.contains(module)) {
      group = latest_call[module];  // a buffer version or constant of the call
    } else {
      if (op.is_compute()) open_module.clear();
      if (rolled && !op.is_input() && !op.is_output()) {
        const absl::string_view layer = LayerOfLabel(op.label);
        group = keyed(absl::StrCat("layer:", layer),
                      RenderGroup{RenderGroup::Kind::kLayer, index, std::string(layer)});
        ++grouping.groups[group].passes;
      } else {
        group = add(RenderGroup{RenderGroup::Kind::kNode, index, op.label, 0, 1});
      }
    }
    grouping.group_of[i] = group;
    if (op.is_compute()) ++grouping.groups[group].compute_ops;
  }
  return grouping;
}

}  // namespace torchlens
