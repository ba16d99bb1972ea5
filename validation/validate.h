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
//     the exemptions listed in validate.cc (arguments an op reads only for their shape,
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

namespace torchlens {

struct ValidationReport {
  bool passed = false;
  int ops_checked = 0;
  std::vector<std::string> failures;  // one line per failed op, naming its label and why
  // Labels of nodes no output or buffer write depends on: replayed and value-checked,
  // never failures.
  std::vector<std::string> dead;
  // Labels of writes replay cannot redo, validated only as state transitions (a write
  // made inside a kernel that is not a known fused mutator, or by several arguments).
  std::vector<std::string> state_transition_only;
  int perturbations_checked = 0;  // parents whose perturbation changed the op's output
  // "op <- parent: why" for edges no perturbation could prove (never failures).
  std::vector<std::string> unproved;
  // Labels of nodes with nothing to check against: ops whose values the capture did not
  // save (NOTE [Selective saving]), and the outputs, buffer versions and alias writes whose
  // value came from one. Never failures.
  std::vector<std::string> not_checked;
  // A halted trace (graph/dead_nodes.h, HaltedForward): labels of the nodes whose readers
  // the halt cut off. Replayed and value-checked like every node; not dead computation,
  // and never failures.
  std::vector<std::string> cut_off;
};

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
