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
//   * buffers: a read version holds the buffer's initial value; a full-buffer kInplace or
//     kReassign version equals its producer's output; a kFused version equals re-running
//     the producer from the previous version (on clones). Slice writes, whose producer
//     output is only part of the buffer, are state-transition-only (listed, not failed).
//   * reachability: every node but the inputs is an ancestor of an output, a buffer write,
//     or an op whose results leave the graph as non-tensors (`item`, comparisons feeding
//     control flow); unread views and ops with only empty outputs are exempt.
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
  // Buffer versions validated only as state transitions (slice writes).
  std::vector<std::string> state_transition_only;
  int perturbations_checked = 0;  // parents whose perturbation changed the op's output
};

// kFailedPrecondition for a trace captured without saved values.
absl::StatusOr<ValidationReport> ValidateForwardPass(const Trace& trace);

}  // namespace torchlens

#endif  // TORCHLENS_VALIDATION_VALIDATE_H_
