// Re-executing one captured op: the engine behind `ValidateForwardPass` and `Do`.
//
// NOTE [Replay never writes captured data]
// A trace's saved tensors are capture truth, and forks share them with the original.
// Replay therefore clones every tensor argument the op writes (arguments whose schema has
// a write annotation, and the state arguments of fused mutators,
// torchlens_dispatch/ops/fused_mutators.h) before the call; all other arguments are passed as they
// are, since an op that does not declare a write does not write. The call runs with the capture key
// excluded, so a replay made while a capture is active on the thread is not recorded.
//
// Ops that consume randomness run under the generator state saved at capture time
// (`Op::rng_state`); the thread's generator state is restored afterwards.
//
// NOTE [Writes through aliases]
// An op that writes a tensor changes every tensor sharing those bytes: the base of a view
// it wrote, the views of a base it wrote, a buffer written through a slice or a permuted
// view (`AliasWrite` in graph/trace.h). Replay redoes such a write in private memory. A
// region of bytes spans both tensors' places (their geometries are recorded in elements
// of their own dtypes: NOTE [Writes through views of another dtype] in replay.cc); it
// receives the changed tensor's value before the write, then the written argument's value
// before it, so that where they share bytes the written argument's value stands. In a
// capture the two agree there (they are the same memory at the same moment); in an
// intervention that edited the written view (`y = x[1]`, then `y.add_(1)`, with `y` set to
// 0.5), the view's new value is what its base holds there, as in eager PyTorch where the
// two share memory. The op then runs on the
// written argument's place in the region (the other tensors it writes are cloned, as in any
// replay), and the changed tensor is read back from its place. Validation compares the result with
// the captured value, and an intervention computes the changed tensor's new value the same way, so
// the two agree on what a write through a view does.
#ifndef TORCHLENS_VALIDATION_REPLAY_H_
#define TORCHLENS_VALIDATION_REPLAY_H_

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "graph/trace.h"

namespace torchlens {

struct ReplayResult {
  std::vector<at::Tensor> outputs;   // every tensor return, in order (like Op::outs)
  std::vector<c10::IValue> returns;  // the returns as the op gave them (scalars included)
  // For fused mutators that updated their state: the state arguments after the call,
  // paired with the argument index (see NOTE [Fused buffer writes]).
  std::vector<std::pair<int, at::Tensor>> state_after;
};

// The tensor to pass for one tensor argument of `op` (index in ForEachTensor order over
// `op.creation_args`, its source, and the value saved at capture time).
using ArgumentValue =
    absl::FunctionRef<at::Tensor(int index, const ArgSource& source, const at::Tensor& saved)>;

// `op.creation_args` with each tensor replaced by `value(...)`.
std::vector<c10::IValue> ReplayArguments(const Op& op, ArgumentValue value);

// Runs `op` on `args`. kFailedPrecondition when the trace holds no saved arguments;
// kNotFound when the operator is not registered in this process; kInternal with the
// op's message when it throws; kFailedPrecondition when the op consumes randomness and
// no generator state was saved.
absl::StatusOr<ReplayResult> ReplayOp(const Op& op, std::vector<c10::IValue> args);

// The value after `op` of the tensor `write` describes (one of `op.alias_writes`), with
// `args` the op's arguments (as ReplayArguments builds them) and `before` that tensor's
// value before the op. See NOTE [Writes through aliases]. kFailedPrecondition when the
// write is not one argument's (written_tensor < 0) or the geometries do not fit the
// values; otherwise as ReplayOp.
absl::StatusOr<at::Tensor> ReplayAliasWrite(const Op& op, const AliasWrite& write,
                                            std::vector<c10::IValue> args,
                                            const at::Tensor& before);

// NOTE [Fused writes through views]
// A fused mutator whose state arguments are views of buffer versions
// (`F.batch_norm(x, self.stats[:, 0], self.stats[:, 1], training=True)`, both running
// statistics in columns of one buffer) writes those buffers through them, by two
// arguments at once. Replay redoes the write on a copy of each buffer as the op found it
// (with its strides): the version before the one the op made, whatever version the views
// were made of, since views made once and kept (a loop's batch norms on `mean, var =
// self.stats[0], self.stats[1]`) see every in-place write of the buffer after them; a
// reassignment in between is refused, its views being of a former tensor. Each view is
// made again of the copy by re-running the view ops between the version and the argument
// (slice, select, ...; each must return a view of the copy; a tensor an earlier alias
// write changed is the view that write names; an in-place op's result, `var.fill_(2)`, is
// the view it wrote, not re-run, the copy holding its write), and the op runs on those
// views, so that its writes land in the copies. The copies are then the buffers after the
// call, and every view of them the op changed is the same view of its copy.
using NodeLookup = std::function<const Op*(absl::string_view label)>;
struct FusedWriteRedone {
  // Each buffer version the state arguments were views of (or were), with a copy of it
  // after the call.
  std::vector<std::pair<const Op*, at::Tensor>> buffers;
  // The copy of buffer `address` after the call, or null.
  const at::Tensor* After(const std::string& address) const;
};
// kFailedPrecondition when `op` is not an updating fused mutator whose state arguments
// are all buffer versions or views of them, at least one a view (plain batch norms are
// checked by NOTE [Fused buffer writes] without a second run); otherwise as ReplayOp.
absl::StatusOr<FusedWriteRedone> RedoFusedWriteThroughViews(const Op& op, const NodeLookup& lookup);
// Output `output` of node `view` (a view of one of `redone`'s buffers; for output < 0, the
// tensor that alias write changed) as it is after the call: the same view made of the
// buffer's copy, copied.
absl::StatusOr<at::Tensor> ViewAfterFusedWrite(const Op& view, int output,
                                               const FusedWriteRedone& redone,
                                               const NodeLookup& lookup);

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
// when the trace has none). `node` finds a node of the trace by label.
struct FusedStateVersions {
  const Op* previous = nullptr;
  const Op* written = nullptr;
};
FusedStateVersions FindFusedStateVersions(const Op& op, int argument,
                                          const std::function<const Op*(absl::string_view)>& node);

// The tensor at `index` (ForEachTensor order) of `args`, or an undefined tensor.
at::Tensor TensorArgument(const std::vector<c10::IValue>& args, int index);

}  // namespace torchlens

#endif  // TORCHLENS_VALIDATION_REPLAY_H_
