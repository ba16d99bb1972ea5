// The floor of a capture that saves every value (bench rows `keep_outputs` and
// `keep_values`, README Performance, "What saving costs without torchlens"): a forward
// pass whose every user-level op's outputs stay alive until the pass ends, observed
// through LibTorch's own RecordFunction callbacks, with no dispatch key and no recording.
// `keep_outputs` keeps references only: what remains is what keeping the outputs costs
// the kernels (each output in new memory instead of the memory the last freed one left
// in cache) and the observer. `keep_values` also copies, with `clone()`, the tensor an
// in-place op (a name ending in `_`) is about to overwrite, as any capture must to keep
// the value it held.
#ifndef TORCHLENS_TOOLS_OUTPUT_KEEPER_H_
#define TORCHLENS_TOOLS_OUTPUT_KEEPER_H_

#include "absl/functional/function_ref.h"

namespace torchlens {

// Runs `forward` on this thread with the outputs of every op it calls at the top level
// (not those its ops call) kept until it returns; with `copy_overwritten`, also a copy of
// each in-place op's first argument made before the op.
void RunKeepingOutputs(absl::FunctionRef<void()> forward, bool copy_overwritten);

}  // namespace torchlens

#endif  // TORCHLENS_TOOLS_OUTPUT_KEEPER_H_
