// The bench's gradient rows: a forward and backward with CaptureOptions::save_grads against
// the plain forward and backward of the same run, and ValidateGradients on the result.
#ifndef TORCHLENS_TOOLS_BENCH_BACKWARD_H_
#define TORCHLENS_TOOLS_BENCH_BACKWARD_H_

#include <torch/script.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace torchlens {

// Rows for model `name` (in training mode or not), each a forward and a backward of the sum
// of its outputs, interleaved, medians over `repeats` rounds (0: as many as fit in a few
// seconds), every parameter's .grad set to none before each run (untimed), as a training
// loop's zero_grad(set_to_none=True) does, and state buffers detached:
//   fwd_bwd                 model.forward (its own executor) and backward: the reference
//   fwd_bwd_private_plan    the private plan captures run (NOTE [Stable plans])
//   capture_fwd_bwd         TraceModule without save_grads, then backward
//   capture_grads_fwd_bwd   TraceModule with save_grads (every value saved), then backward
//   capture_grads_unsaved   the same without saved values (save_activations = false)
//   validate_grads          ValidateGradients of a capture with gradients ("passed" says)
// `configs`, when not empty, keeps those rows and fwd_bwd. Null when the model cannot be
// captured.
nlohmann::json BenchBackward(const std::string& name, torch::jit::Module& model,
                             const std::vector<c10::IValue>& inputs, int repeats,
                             const std::vector<std::string>& configs);

}  // namespace torchlens

#endif  // TORCHLENS_TOOLS_BENCH_BACKWARD_H_
