// Proof that a trace is true: every saved value is what its op computes from its saved
// arguments, and the graph's edges are the real data flow.
//
//   absl::StatusOr<torchlens::ValidationReport> report = torchlens::ValidateForwardPass(*trace);
//   if (report.ok() && !report->passed) {
//     for (const std::string& failure : report->failures) std::cerr << failure << "\n";
//   }
//
// What is checked (README "Validation" has the details):
//   * replay: each op re-runs (replay.h) from its saved arguments and must reproduce its
//     saved outputs bit for bit; ops that consume randomness re-run under the generator
//     state saved at capture.
//   * edges: an op's parents are exactly the nodes its arguments came from, and each saved
//     argument is the saved output of the node named for it.
//   * perturbation: replacing a parent's value must change the op's output, except for
//     the exemptions of perturbation_check.h (arguments an op reads only for their shape,
//     fused mutators' running statistics, empty tensors, and data-dependent cases the
//     saved values prove).
//   * buffers: a read version holds the buffer's initial value (an independent copy); a
//     kInplace or kReassign version equals the value its producer gave it (an output, or
//     the buffer after a write through a slice or view, redone as an alias write); a
//     kFused version equals re-running the producer from the previous version (on clones).
//   * alias writes: a tensor an op changed through a view or a base of what it wrote
//     (graph/trace.h AliasWrite) equals redoing the write on its earlier value (replay.h).
//   * dead computation: nodes that no output, buffer write or non-tensor result depends
//     on (a value the model computes and discards) are checked like every other node and
//     listed in `dead`; they are never failures.
//   * partly saved traces (selective saving, the memory budget): what has saved values is
//     checked; the rest is listed in `not_checked`, never a failure.
// Perturbation reports an edge it could not prove (a predicate or NaN data that no
// perturbation tried changes, an argument the op ignores for these values, values that
// cannot be perturbed) in `unproved`, never as a failure (NOTE [Perturbations that can
// prove] in values.h).
#ifndef TORCHLENS_VALIDATION_VALIDATE_H_
#define TORCHLENS_VALIDATION_VALIDATE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/trace.h"
#include "validation/validation_report.h"  // IWYU pragma: export

namespace torchlens {

struct ValidationOptions {
  // Threads that check ops at once (each op is checked from its own saved values). The
  // report is the same for any number; 1 runs on the calling thread only.
  int threads = 1;
};

// kFailedPrecondition for a trace captured without saved values; kInvalidArgument for
// threads < 1.
absl::StatusOr<ValidationReport> ValidateForwardPass(const Trace& trace);
absl::StatusOr<ValidationReport> ValidateForwardPass(const Trace& trace,
                                                     const ValidationOptions& options);

// The gradients of a trace captured with CaptureOptions::save_grads, after a backward:
// each value's saved gradient must be the sum of what the backward of each op that read it
// gives, re-run from the op's saved arguments and its outputs' saved gradients, summed in
// the order autograd accumulated them (NOTE [Checking a gradient] in
// validate_gradients.cc); bit for bit where the kernels are deterministic. `ops_checked`
// counts the values checked; `failures` names each value whose gradient is not what its
// readers give (a tampered gradient); `unproved` those equal only up to rounding; and
// `not_checked` the values whose gradient came partly from outside the trace (outputs) and
// the ops without saved arguments. ValidateForwardPass keeps its meaning. Errors:
// kFailedPrecondition for a trace without saved values or without gradients.
absl::StatusOr<ValidationReport> ValidateGradients(const Trace& trace);

// The report as a JSON object with the fields above ("passed", "ops_checked", "failures",
// "dead", "state_transition_only", "perturbations_checked", "unproved", "not_checked").
std::string ValidationReportToJson(const ValidationReport& report);

}  // namespace torchlens

#endif  // TORCHLENS_VALIDATION_VALIDATE_H_
