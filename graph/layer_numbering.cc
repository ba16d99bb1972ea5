#include "graph/layer_numbering.h"

namespace torchlens {

int32_t LayerNumbering::TypeId(absl::string_view type) {
  auto [it, inserted] = type_ids_.try_emplace(type, static_cast<int32_t>(type_ids_.size()));
  if (inserted) layers_of_type_.push_back(0);
  return it->second;
}

LayerNumbering::Numbers LayerNumbering::Next(int32_t layer, int32_t type_id) {
  // A layer without an id (a capture bug) is a layer of its own.
  const size_t id = layer >= 0 ? static_cast<size_t>(layer) : layers_.size();
  if (id >= layers_.size()) layers_.resize(id + 1);
  Layer& numbers = layers_[id];
  if (numbers.passes == 0) {
    numbers.type_index = ++layers_of_type_[type_id];
    numbers.step_index = ++steps_;
  }
  return Numbers{numbers.type_index, numbers.step_index, ++numbers.passes};
}

}  // namespace torchlens
