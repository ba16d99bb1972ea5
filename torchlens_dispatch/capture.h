// Capturing a forward pass into a `Trace`.
//
// While a `CaptureGuard` is alive, every ATen op its thread dispatches is recorded against
// the model's registered parameters, buffers and submodules; `Finish` returns the trace.
// Other threads are not affected, and the model computes exactly what it computes without
// the guard.
//
//   torch::jit::Module model = torch::jit::load("model.pt");
//   torchlens::CaptureGuard guard(model);
//   c10::IValue out = model.forward({x});
//   absl::StatusOr<torchlens::Trace> trace = guard.Finish(out);
//
// or in one call: `torchlens::TraceModule(model, {x})`.
//
// Behaviour worth knowing (README.md has the details):
//   * Which ops a TorchScript model runs depends on its executor's plan, which the
//     executor rewrites between runs (script_runner.h, NOTE [Stable plans]).
//     `TraceModule` runs a private unoptimized plan: the same ops and labels on every
//     capture, whatever ran before. Under a `CaptureGuard` the model runs its own
//     executor, with optimization off on the capturing thread (plans built while capturing
//     are unoptimized); a plan the executor already optimized is what runs. In inference
//     (NoGradGuard / InferenceMode) on CPU that plan runs the same ops; in grad mode
//     autodiff splits some (batch_norm). Use TraceModule where labels must not depend on
//     the model's run history.
//   * Nesting: a guard created on a thread that is already capturing is inert; it changes
//     nothing and its `Finish` returns kFailedPrecondition. The outer capture continues.
//   * A guard must be destroyed on the thread that created it.
//   * If the forward pass throws, the exception propagates unchanged; destroying the guard
//     restores the thread's dispatch state, and `Finish` reports kAborted.
//   * Only the guard's thread is captured. A TorchScript model that forks work onto other
//     threads (`torch.jit.fork` / `wait`) is refused rather than traced in part: the guard
//     stays inactive and `Finish` (and `TraceModule`, before running anything) returns
//     kUnimplemented naming where the code forks.
#ifndef TORCHLENS_DISPATCH_CAPTURE_H_
#define TORCHLENS_DISPATCH_CAPTURE_H_

#include <ATen/core/ivalue.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "graph/trace.h"
#include "torchlens_dispatch/capture_options.h"
#include "torchlens_dispatch/eager_model.h"
#include "torchlens_dispatch/module_fwd.h"

namespace torchlens {

// While alive, everything this thread dispatches is captured against `model`'s
// registered buffers, parameters and submodules. Not copyable, not movable.
class CaptureGuard {
 public:
  explicit CaptureGuard(torch::jit::Module& model, CaptureOptions options = {});
  explicit CaptureGuard(torch::nn::Module& model, CaptureOptions options = {});
  // An eager PyTorch model, as the Python front-end describes it (eager_model.h): ops
  // belong to the module whose call is open (eager_scope.h).
  explicit CaptureGuard(const EagerModel& model, CaptureOptions options = {});
  ~CaptureGuard();  // ends capture if Finish was not called; never throws

  CaptureGuard(const CaptureGuard&) = delete;
  CaptureGuard& operator=(const CaptureGuard&) = delete;
  CaptureGuard(CaptureGuard&&) = delete;
  CaptureGuard& operator=(CaptureGuard&&) = delete;

  // Marks `outputs` (a Tensor, or a tuple/list of them) as the model outputs, ends capture
  // and returns the trace. Only the first call does anything; later calls return
  // kFailedPrecondition. Errors: kFailedPrecondition for an inert guard or an unjournaled
  // buffer change (see CaptureOptions::allow_unjournaled_writes), kAborted when the forward
  // pass threw while capturing, kUnimplemented for a model whose code forks work onto
  // other threads (`torch.jit.fork`): such a guard captures nothing, naming the fork.
  absl::StatusOr<Trace> Finish(const c10::IValue& outputs);
  // Instead of Finish, after the forward pass raised: ends capture and returns the ops
  // that ran until then, without outputs, marked partial (`Trace::partial_reason()` is
  // `reason`, where "{label}" stands for the last node's label). Buffer changes that no
  // version explains are diagnostics. Errors as Finish's, but for kAborted.
  absl::StatusOr<Trace> FinishAfterForwardError(std::string reason);

  // Stops capturing on this thread (its dispatch state is restored) without finishing:
  // ops the thread runs from now on are not captured, and Finish can still mark outputs
  // and return the trace. The Python front-end's `with tl.capture(...)` block ends here.
  void Stop();

  // Optional: names the tensors in `inputs` input_1, input_2, ... in this order. Without
  // it, tensors from outside the capture become inputs in order of first use; with it,
  // such other tensors are constants. `TraceModule` calls it.
  void MarkInputs(const c10::IValue& inputs);

  // False for an inert guard (another guard was capturing on this thread) and for a
  // refused model (it forks work onto other threads).
  bool active() const;
  // Whether CaptureOptions::halt_after stopped the forward (Finish then returns the trace
  // so far, marked partial).
  bool halted() const;

 private:
  struct State;
  // Finish, or with `forward_error` FinishAfterForwardError.
  absl::StatusOr<Trace> End(const c10::IValue& outputs, std::optional<std::string> forward_error);

  std::unique_ptr<State> state_;
  absl::Status refusal_;  // why this model is not captured (it forks), or OK
  bool finished_ = false;
};

// Runs model.forward(inputs) under a CaptureGuard, through a private unoptimized plan
// (NOTE [Stable plans]). A forward that throws (inputs of the wrong shape, dtype or count,
// the model's own `raise` or `assert`) returns kInvalidArgument with the innermost cause
// and the model's source line (script_errors.h); running out of memory, kResourceExhausted.
absl::StatusOr<Trace> TraceModule(torch::jit::Module& model, std::vector<c10::IValue> inputs,
                                  CaptureOptions options = {});
// The same, also handing back the forward's return value in `*outputs` (its tensors keep
// their autograd graph): with CaptureOptions::save_grads, a backward() from them fills the
// trace's gradients.
//
//   CaptureOptions options;
//   options.save_grads = true;
//   c10::IValue out;
//   absl::StatusOr<Trace> trace = TraceModule(model, {x}, options, &out);
//   out.toTensor().sum().backward();   // trace->ops()[i].grad now holds each gradient
absl::StatusOr<Trace> TraceModule(torch::jit::Module& model, std::vector<c10::IValue> inputs,
                                  CaptureOptions options, c10::IValue* outputs);

}  // namespace torchlens

#endif  // TORCHLENS_DISPATCH_CAPTURE_H_
