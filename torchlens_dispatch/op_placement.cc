#include "torchlens_dispatch/op_placement.h"

#include <algorithm>
#include <atomic>

namespace torchlens {

OpPlacement::OpPlacement(const ModelLayout& layout)
    : layout_(layout),
      addresses_(ModuleTree{layout.serial, layout.module_addresses, &layout.module_ids,
                            &layout.module_types, &layout.module_children, &layout.layer_classes}),
      script_sites_(&addresses_) {
  constexpr auto kRelaxed = std::memory_order_relaxed;
  layers_.reserve(layout.last_capture_sizes.layers.load(kRelaxed));
  layer_of_class_.assign(layout.last_capture_sizes.layer_classes.load(kRelaxed), -1);
}

OpPlacement::Place OpPlacement::Locate(c10::Symbol symbol, int32_t op_index, int32_t owner_module,
                                       std::vector<std::shared_ptr<const void>>* position_owners) {
  const ScriptSite site = layout_.torchscript ? script_sites_.Current(symbol)
                          : layout_.eager     ? EagerSite()
                                              : ScriptSite{};
  Place place;
  place.module = site.in_script || layout_.eager ? site.module : std::max<int32_t>(owner_module, 0);
  if (site.in_script && site.unknown_instance && owner_module >= 0 &&
      IsWithin(owner_module, site.module)) {
    // TorchScript could not name the submodule (a ModuleList iterated in a loop): the
    // module owning the parameters or buffers the op reads names it.
    place.module = owner_module;
  }
  const int32_t layers_before = next_layer_;
  place.layer = LayerOf(place.module, op_index, site);
  place.new_layer = next_layer_ > layers_before;
  if (place.new_layer) place.first_position = script_sites_.PositionOf(site, position_owners);
  return place;
}

ScriptSite OpPlacement::EagerSite() {
  ScriptSite site;
  if (!open_calls_.empty()) {
    OpenCall& call = open_calls_.back();
    site.module = call.module;
    site.position = ++call.ops;
  }
  return site;
}

bool OpPlacement::EnterModule(const void* module) {
  auto it = layout_.eager_module_ids.find(module);
  if (it == layout_.eager_module_ids.end()) return false;
  // A module's forward calling its own forward again (`super().forward(x)` through a
  // patched base class) continues the call it is in.
  if (!open_calls_.empty() && open_calls_.back().module == it->second) return false;
  open_calls_.push_back(OpenCall{it->second, 0});
  return true;
}

void OpPlacement::ExitModule() {
  if (!open_calls_.empty()) open_calls_.pop_back();
}

bool OpPlacement::IsWithin(int32_t inner, int32_t outer) const {
  if (outer == 0) return true;
  // Modules interned during the capture (ModuleAddresses' extra ones) have addresses too.
  const std::string& a = addresses_.Address(inner);
  const std::string& b = addresses_.Address(outer);
  return a.size() > b.size() && a.compare(0, b.size(), b) == 0 && a[b.size()] == '.';
}

int32_t OpPlacement::LayerOf(int32_t module, int32_t op_index, const ScriptSite& site) {
  // See NOTE [Layers and passes].
  if (!site.in_script && module == 0) return next_layer_++;
  if (site.layer_class >= 0 && module == site.module) {
    // See NOTE [Layer classes].
    const size_t number = static_cast<size_t>(site.layer_class);
    if (number >= layer_of_class_.size()) {
      layer_of_class_.resize(std::max(number + 1, 2 * layer_of_class_.size()), -1);
    }
    int32_t& layer = layer_of_class_[number];
    if (layer < 0) layer = next_layer_++;
    return layer;
  }
  const LayerKey key{module, op_index, site.in_script || layout_.eager ? site.position : 0};
  auto [it, inserted] = layers_.try_emplace(key, next_layer_);
  if (inserted) ++next_layer_;
  return it->second;
}

void OpPlacement::StoreSizes(ModelLayout::CaptureSizes* sizes) const {
  constexpr auto kRelaxed = std::memory_order_relaxed;
  sizes->layers.store(static_cast<uint32_t>(layers_.size()), kRelaxed);
  sizes->layer_classes.store(static_cast<uint32_t>(layer_of_class_.size()), kRelaxed);
}

}  // namespace torchlens
