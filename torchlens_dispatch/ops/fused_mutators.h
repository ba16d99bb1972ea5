// Ops whose native kernels write their arguments without saying so.
//
// NOTE [Fused buffer writes]
// `native_batch_norm` updates `running_mean` and `running_var` through raw pointers: the
// schema carries no alias annotation and the tensors' version counters do not move, so
// neither the schema nor `_version` reveals the write; only comparing values does.
// `instance_norm` runs batch_norm on repeated copies and writes the result back with an
// annotated `copy_` inside the kernel. For every op listed here the capture clones the
// state arguments before the call (that clone is also the copy-on-write of any saved
// value they alias), compares after it, and records one kFused version per updated
// registered buffer per call. The list is the whole mechanism: add an op here, not an `if`
// elsewhere. Replay (validation/) uses the same list to clone the state arguments
// before re-running these ops and to check the state transitions.
//
// The list names arguments, never positions: positions are resolved from the schema that
// LibTorch registered, once, so that a LibTorch whose schema renamed or dropped one fails
// loudly (an exception naming the operator and the argument) instead of reading another
// argument.
#ifndef TORCHLENS_DISPATCH_OPS_FUSED_MUTATORS_H_
#define TORCHLENS_DISPATCH_OPS_FUSED_MUTATORS_H_

#include <ATen/core/ivalue.h>
#include <ATen/core/stack.h>

#include "absl/strings/string_view.h"

namespace torchlens {

struct FusedMutator {
  absl::string_view name;  // operator name without overload, "aten::batch_norm"
  int num_state_arguments;
  int state_arguments[2];    // argument positions of the running statistics
  int update_flag_argument;  // the bool argument that says the call updates them; -1: always
};

// The entry for the operator `name`, or nullptr. The first call resolves every entry's
// argument positions from the registered schemas, and throws std::logic_error if a schema
// lacks an argument the list names.
const FusedMutator* FindFusedMutator(absl::string_view name);

// Whether this call, with `args` its arguments, updates the state arguments.
bool UpdatesState(const FusedMutator& mutator, c10::ArrayRef<c10::IValue> args);

// Whether argument `index` of a call of `mutator` is a state argument.
bool IsStateArgument(const FusedMutator& mutator, int index);

}  // namespace torchlens

#endif  // TORCHLENS_DISPATCH_OPS_FUSED_MUTATORS_H_
