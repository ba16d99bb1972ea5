#include "torchlens_dispatch/parameter_state.h"

#include <ATen/core/grad_mode.h>

#include <algorithm>

namespace torchlens {

int32_t ParameterState::IdOf(const c10::TensorImpl* impl) {
  // See ModelLayout::param_order.
  const std::vector<std::pair<const c10::TensorImpl*, int32_t>>& order = layout_.param_order;
  if (next_ < order.size() && order[next_].first == impl) {
    // The parameters expected 16 reads ahead, and their modules (ids follow the order but
    // for tied parameters): both arrays are cold when a capture starts, and sequential
    // reads spaced a whole op apart are too sparse for the hardware to see (NOTE [Cold
    // record memory]).
    const size_t ahead = std::min(next_ + 16, order.size() - 1);
    __builtin_prefetch(&order[ahead]);
    __builtin_prefetch(&layout_.param_modules[ahead]);
    return order[next_++].second;
  }
  auto it = layout_.param_ids.find(impl);
  if (it == layout_.param_ids.end()) return -1;
  next_ = static_cast<size_t>(it->second) + 1;
  return it->second;
}

void ParameterState::KeepBeforeHalt(const at::Tensor& tensor) {
  if (storages_.empty()) {
    for (size_t p = 0; p < layout_.params.size(); ++p) {
      const at::Tensor& param = layout_.params[p].tensor;
      if (param.defined() && param.has_storage()) {
        storages_.emplace(param.storage().unsafeGetStorageImpl(), static_cast<int32_t>(p));
      }
    }
  }
  auto it = storages_.find(tensor.storage().unsafeGetStorageImpl());
  if (it == storages_.end() || it->second < 0) return;
  const int32_t param = it->second;
  it->second = -1;  // kept once
  before_writes_.emplace_back(param, layout_.params[param].saved.clone());
}

void ParameterState::RestoreWritten() {
  // The halt copied the values saved in these parameters' storages first.
  at::NoGradGuard no_grad;
  for (const auto& [param, before] : before_writes_) layout_.params[param].saved.copy_(before);
}

}  // namespace torchlens
