#include "torchlens_dispatch/ops/fused_mutators.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace torchlens {
namespace {

// See NOTE [Fused buffer writes]: each operator, its state arguments and the flag that
// says a call updates them, by name.
struct FusedMutatorNames {
  absl::string_view op;
  absl::string_view state[2];
  absl::string_view update_flag;
};

constexpr FusedMutatorNames kFusedMutators[] = {
    {"aten::batch_norm", {"running_mean", "running_var"}, "training"},
    {"aten::_batch_norm_impl_index", {"running_mean", "running_var"}, "training"},
    {"aten::native_batch_norm", {"running_mean", "running_var"}, "training"},
    // Always writes them back: in eval mode too (use_input_stats false) it copies the mean
    // of the repeated statistics back, which rounds for 7 or more samples.
    {"aten::instance_norm", {"running_mean", "running_var"}, ""},
    // Always updates them (no flag): SyncBatchNorm's and functorch's building block.
    {"aten::batch_norm_update_stats", {"running_mean", "running_var"}, ""},
};

int Position(const c10::FunctionSchema& schema, absl::string_view argument) {
  c10::optional<int> index = schema.argumentIndexWithName(std::string(argument));
  if (!index.has_value()) {
    throw std::logic_error(absl::StrCat(
        "torchlens' fused-mutator table names argument '", argument, "' of ", schema.name(),
        ", which this LibTorch's schema does not have: update torchlens_dispatch/ops/"
        "fused_mutators.cc for it"));
  }
  return *index;
}

std::vector<FusedMutator> Resolve() {
  std::vector<FusedMutator> resolved;
  for (const FusedMutatorNames& names : kFusedMutators) {
    c10::optional<c10::OperatorHandle> handle =
        c10::Dispatcher::singleton().findSchema({std::string(names.op), ""});
    if (!handle.has_value()) {
      throw std::logic_error(absl::StrCat("torchlens' fused-mutator table names ", names.op,
                                          ", which this LibTorch does not register"));
    }
    const c10::FunctionSchema& schema = handle->schema();
    resolved.push_back(
        FusedMutator{names.op,
                     2,
                     {Position(schema, names.state[0]), Position(schema, names.state[1])},
                     names.update_flag.empty() ? -1 : Position(schema, names.update_flag)});
  }
  return resolved;
}

}  // namespace

const FusedMutator* FindFusedMutator(absl::string_view name) {
  // Resolved once; an exception leaves it unresolved, to fail again on the next call.
  static const std::vector<FusedMutator>* const kResolved =
      new std::vector<FusedMutator>(Resolve());
  for (const FusedMutator& mutator : *kResolved) {
    if (mutator.name == name) return &mutator;
  }
  return nullptr;
}

bool UpdatesState(const FusedMutator& mutator, c10::ArrayRef<c10::IValue> args) {
  if (mutator.update_flag_argument < 0) return true;  // updates on every call
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
