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

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "graph/trace.h"
#include "validation/op_arguments.h"

namespace torchlens {

struct ReplayResult {
  std::vector<at::Tensor> outputs;   // every tensor return, in order (like Op::outs)
  std::vector<c10::IValue> returns;  // the returns as the op gave them (scalars included)
  // For fused mutators that updated their state: the state arguments after the call,
  // paired with the argument index (see NOTE [Fused buffer writes]).
  std::vector<std::pair<int, at::Tensor>> state_after;
};

// Whether two runs of an op returned the same non-tensor values (the Scalar of `item`, the
// bool of `equal`), by value.
bool SameNonTensorReturns(const ReplayResult& a, const ReplayResult& b);
// Whether two runs of an op returned the same: tensors bit for bit, other values as
// SameNonTensorReturns.
bool SameReturns(const ReplayResult& a, const ReplayResult& b);

// Runs `op` on `args`. kFailedPrecondition when the trace holds no saved arguments;
// kNotFound when the operator is not registered in this process; kInternal with the
// op's message when it throws; kFailedPrecondition when the op consumes randomness and
// no generator state was saved.
// The tensors numbered `private_tensors` (ForEachTensor order over `args`) are the
// caller's own, made for this call: the op writes them in place instead of clones.
absl::StatusOr<ReplayResult> ReplayOp(const Op& op, std::vector<c10::IValue> args,
                                      absl::Span<const int> private_tensors = {});

// The value after `op` of the tensor `write` describes (one of `op.alias_writes`), with
// `args` the op's arguments (as ReplayArguments builds them) and `before` that tensor's
// value before the op. See NOTE [Writes through aliases]. kFailedPrecondition when the
// write is not one argument's (written_tensor < 0) or the geometries do not fit the
// values; otherwise as ReplayOp.
absl::StatusOr<at::Tensor> ReplayAliasWrite(const Op& op, const AliasWrite& write,
                                            std::vector<c10::IValue> args,
                                            const at::Tensor& before);

}  // namespace torchlens

#endif  // TORCHLENS_VALIDATION_REPLAY_H_
