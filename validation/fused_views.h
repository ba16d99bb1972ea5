// Redoing a fused mutator's write through views of buffers (NOTE [Fused writes through
// views]), and with it any write through an alias (NOTE [Writes through aliases] in
// validation/replay.h), for validation and interventions.
#ifndef TORCHLENS_VALIDATION_FUSED_VIEWS_H_
#define TORCHLENS_VALIDATION_FUSED_VIEWS_H_

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "graph/trace.h"

namespace torchlens {

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
//
// `nodes` below are the ops of the trace `op` belongs to, or of a fork of it: the ones its
// argument sources index (ArgSource::node).
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
absl::StatusOr<FusedWriteRedone> RedoFusedWriteThroughViews(const Op& op,
                                                            const std::vector<Op>& nodes);
// Output `output` of node `view` (a view of one of `redone`'s buffers; for output < 0, the
// tensor that alias write changed) as it is after the call: the same view made of the
// buffer's copy, copied.
absl::StatusOr<at::Tensor> ViewAfterFusedWrite(const Op& view, int output,
                                               const FusedWriteRedone& redone,
                                               const std::vector<Op>& nodes);

// The tensor alias write `write` of `op` changed, as it is after a call on `args`: the
// write redone on `before`, its value before the call (ReplayAliasWrite); when that cannot
// be (or `before` is null) and the write is no argument's, the view of a buffer a fused
// mutator wrote through, from `through_views` (RedoFusedWriteThroughViews, asked only
// then; null when there is none).
absl::StatusOr<at::Tensor> RedoAliasWrite(
    const Op& op, const AliasWrite& write, std::vector<c10::IValue> args, const at::Tensor* before,
    const std::vector<Op>& nodes, absl::FunctionRef<const FusedWriteRedone*()> through_views);

}  // namespace torchlens

#endif  // TORCHLENS_VALIDATION_FUSED_VIEWS_H_
