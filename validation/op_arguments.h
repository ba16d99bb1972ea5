// What a trace says about one op's call, as replay needs it: its operator, its arguments
// as saved (and their tensors in ForEachTensor order), which of them it writes, and which
// of its outputs are views of an argument.
#ifndef TORCHLENS_VALIDATION_OP_ARGUMENTS_H_
#define TORCHLENS_VALIDATION_OP_ARGUMENTS_H_

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <functional>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "graph/trace.h"

namespace torchlens {

// The operator `op` names, from a small per-thread cache (validation replays each op
// several times). kNotFound when it is not registered in this process.
absl::StatusOr<c10::OperatorHandle> OperatorOf(const Op& op);

// The tensor to pass for one tensor argument of `op` (index in ForEachTensor order over
// `op.creation_args`, its source, and the value saved at capture time).
using ArgumentValue =
    absl::FunctionRef<at::Tensor(int index, const ArgSource& source, const at::Tensor& saved)>;

// `op.creation_args` with each tensor replaced by `value(...)`.
std::vector<c10::IValue> ReplayArguments(const Op& op, ArgumentValue value);

// `op.creation_args`, as the op tables (torchlens_dispatch/ops/exemptions.h) read them.
inline c10::ArrayRef<c10::IValue> ArgumentsOf(const Op& op) {
  return c10::ArrayRef<c10::IValue>(op.creation_args.data(), op.creation_args.size());
}

// `op.creation_args` as the capture saved them, in containers of their own (a replay may
// change a list it is given).
std::vector<c10::IValue> CapturedArguments(const Op& op);

// Calls `visit` on each saved tensor that replaying ops[i] from the trace reads or
// compares: its arguments, its outputs and alias writes' values, and its parents' values
// (what validation and Do give back after their last use: NOTE [Releasing after the last
// use] in graph/release_after_last_use.h).
void VisitValuesReplayReads(const std::vector<Op>& ops, size_t i,
                            const std::function<void(const at::Tensor&)>& visit);

// Whether the op consumes randomness (tagged nondeterministic_seeded or takes a Generator).
bool ConsumesRandomness(const Op& op);

// NOTE [Arguments a trace file cannot hold]
// A trace file keeps an op's arguments only when Python can unpickle all of them
// ("creation_args_complete"): quantized ops' packed parameters and other TorchBind objects
// are left out, and the op read back holds its outputs but no arguments. Such an op
// cannot be re-run from the file: validation lists it as not checked (its consumers still
// check against its saved outputs) and an edit that reaches it is an error naming it.
// Whether `op` is such an op: saved outputs, no saved arguments, and an operator that
// takes some.
bool ArgumentsNotKept(const Op& op);

// kFailedPrecondition saying that a trace without saved values cannot be used to
// `purpose` ("validate it"), or OK.
absl::Status RequireSavedValues(const Trace& trace, absl::string_view purpose);

// For each argument position of `op`, the tensor index (ForEachTensor order over
// `op.creation_args`, the position of its source in `op.arg_sources`) of its first
// tensor; -1 for arguments that hold no tensor.
std::vector<int> FirstTensorOfArguments(const Op& op);

// The source of the argument whose memory output `output` of `op` is a view of (`select`,
// `slice`, `view`, `transpose`, ...: a returned tensor the schema aliases to an argument it
// does not write), or null for any other output.
const ArgSource* ViewedSource(const Op& op, int output);

// The tensor indexes (as in FirstTensorOfArguments) of `op`'s out= arguments
// (`torch.add(a, b, out=y)`: kwarg-only arguments the schema declares written). Empty when
// the operator is not registered in this process.
std::vector<int> OutTensors(const Op& op);

// The buffer versions around a fused write (NOTE [Fused buffer writes]): for state
// argument `argument` of `op`, the version the call read (`previous`, null when the
// argument is not a registered buffer) and the kFused version it wrote (`written`, null
// when the trace has none). `nodes` are the ops of `op`'s trace (or of a fork of it).
struct FusedStateVersions {
  const Op* previous = nullptr;
  const Op* written = nullptr;
};
FusedStateVersions FindFusedStateVersions(const Op& op, int argument, const std::vector<Op>& nodes);

// The tensor at `index` (ForEachTensor order) of `args`, or an undefined tensor.
at::Tensor TensorArgument(const std::vector<c10::IValue>& args, int index);

}  // namespace torchlens

#endif  // TORCHLENS_VALIDATION_OP_ARGUMENTS_H_
