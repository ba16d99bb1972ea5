#include "graph/fused_mutators.h"

namespace torchlens {
namespace {

// See NOTE [Fused buffer writes]. Argument positions follow the 1.13 schemas:
//   batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps,
//              cudnn_enabled)
//   _batch_norm_impl_index(<same as batch_norm>)
//   native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum,
//                     eps)
//   instance_norm(input, weight, bias, running_mean, running_var, use_input_stats,
//                 momentum, eps, cudnn_enabled)
constexpr FusedMutator kFusedMutators[] = {
    {"aten::batch_norm", 2, {3, 4}, 5},
    {"aten::_batch_norm_impl_index", 2, {3, 4}, 5},
    {"aten::native_batch_norm", 2, {3, 4}, 5},
    {"aten::instance_norm", 2, {3, 4}, 5},
};

}  // namespace

const FusedMutator* FindFusedMutator(absl::string_view name) {
  for (const FusedMutator& mutator : kFusedMutators) {
    if (mutator.name == name) return &mutator;
  }
  return nullptr;
}

bool UpdatesState(const FusedMutator& mutator, c10::ArrayRef<c10::IValue> args) {
  if (mutator.update_flag_argument >= static_cast<int>(args.size())) return false;
  const c10::IValue& flag = args[mutator.update_flag_argument];
  return flag.isBool() && flag.toBool();
}

bool IsStateArgument(const FusedMutator& mutator, int index) {
  for (int s = 0; s < mutator.num_state_arguments; ++s) {
    if (mutator.state_arguments[s] == index) return true;
  }
  return false;
}

}  // namespace torchlens
