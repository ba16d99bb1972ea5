#include "torchlens_dispatch/layer_classes.h"

namespace torchlens {

int32_t LayerClasses::Number(int32_t module, c10::Symbol op, uint64_t position) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto [it, inserted] =
      numbers_.try_emplace(std::make_tuple(module, static_cast<uint32_t>(op), position),
                           static_cast<int32_t>(numbers_.size()));
  return it->second;
}

}  // namespace torchlens
