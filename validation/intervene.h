// Intervention replay: edit values inside a captured forward pass and see what changes
// downstream, without running the model again.
//
//   torchlens::Edit edit{"relu_1_2:1", at::full({1, 4}, 5.0)};
//   absl::StatusOr<torchlens::DoResult> result = torchlens::Do(*trace, {edit});
//   if (!result.ok()) return result.status();
//   at::Tensor y = (*result->trace.Find("output_1"))->out;
//   for (const torchlens::Diagnostic& warning : result->warnings) std::cerr << warning.message;
//
// `Do` returns a fork of the trace: a new `Trace` whose nodes outside the edits' cone of
// effect share their saved tensors with the original (no copies), whose edited nodes hold
// copies of the edit values, and whose cone (every node downstream of an edit) is
// re-executed in capture order from saved arguments (replay.h). Neither the original trace,
// its tensors, nor the edit tensors are ever written (NOTE [Replay never writes captured
// data]).
//
// NOTE [Threading buffer state]
// A buffer version in the cone commits the recomputed post-write state, so later readers,
// later in-place writes included, see the propagated value. Threading certifies itself: it
// applies to kInplace and kReassign versions whose captured value equals their producer's
// captured output (the producer wrote the whole buffer). Any other written version in the
// cone (a slice write, whose producer's output is only part of the buffer; a fused write
// whose value changed) keeps its captured value and yields a kBufferThreadGap diagnostic,
// or, under DoOptions::strict, an error and no fork. A fused version whose value did not
// change is not a gap: its value does not depend on the edit.
#ifndef TORCHLENS_VALIDATION_INTERVENE_H_
#define TORCHLENS_VALIDATION_INTERVENE_H_

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/trace.h"

namespace torchlens {

struct Edit {
  std::string label;  // any key Trace::Find accepts: "relu_1_2:1", "b:1", "buffer_1:2"
  at::Tensor value;   // same shape and dtype as the node's value
};

struct DoOptions {
  bool strict = false;  // a buffer thread gap is an error
};

enum class DiagnosticKind { kBufferThreadGap };

struct Diagnostic {
  DiagnosticKind kind;
  std::string label;  // the buffer version
  std::string message;
};

struct DoResult {
  Trace trace;
  std::vector<Diagnostic> warnings;
  std::vector<std::string> reexecuted;  // labels of the re-executed nodes, in order
};

// Errors, with nothing changed: kNotFound / kInvalidArgument for a label Find rejects;
// kInvalidArgument for a value of the wrong shape or dtype, an undefined value, or two
// edits of one node; kFailedPrecondition for a trace without saved values, or a thread gap
// under strict; the replay error of a cone op that cannot be re-executed.
absl::StatusOr<DoResult> Do(const Trace& trace, std::vector<Edit> edits, DoOptions options = {});

}  // namespace torchlens

#endif  // TORCHLENS_VALIDATION_INTERVENE_H_
