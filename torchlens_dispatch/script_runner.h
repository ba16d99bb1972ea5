// Running a TorchScript method through a private, unoptimized execution plan.
//
// NOTE [Stable plans]
// A TorchScript method's executor rewrites its plan between runs: the profiling executor
// profiles the first runs, then optimizes (in grad mode autodiff splits ops such as
// `batch_norm` into `_batch_norm_impl_index` plus `detach`es, and inlined call-stack
// information, hence module attribution, is lost for them). Capturing through the model's
// own executor therefore sees whatever plan that executor settled on. `RunUnoptimized`
// instead runs a private copy of the method's graph with the simple executor (inlining and
// the no-optimization passes only), so every run of a model executes the same ops in the
// same order whatever ran before, and the model's own executor is never touched (safe while
// other threads run the model). `TraceModule` captures through it. The private copy also
// carries site markers (script_sites.h, NOTE [Site markers]) that make module attribution
// cheap.
#ifndef TORCHLENS_DISPATCH_SCRIPT_RUNNER_H_
#define TORCHLENS_DISPATCH_SCRIPT_RUNNER_H_

#include <ATen/core/ivalue.h>

#include <cstddef>
#include <string>
#include <vector>

namespace torch {
namespace jit {
struct Module;
}  // namespace jit
}  // namespace torch

namespace torchlens {

// Runs `model.<method>(inputs)` as described above. Throws what the model throws
// (c10::Error for inputs that do not fit the method's schema). Private plans are cached per
// method graph and shared by all threads, and released after their model is destroyed.
c10::IValue RunUnoptimized(torch::jit::Module& model, std::vector<c10::IValue> inputs,
                           const std::string& method = "forward");

// How many private plans are cached, live or awaiting a sweep (NOTE [Private plan
// lifetime] in script_runner.cc); for tests.
size_t PrivatePlansForTesting();

}  // namespace torchlens

#endif  // TORCHLENS_DISPATCH_SCRIPT_RUNNER_H_
