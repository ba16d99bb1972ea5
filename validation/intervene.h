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
// later in-place writes included, see the propagated value. Threading certifies itself:
// a version takes its recomputed value only when recomputing it from the captured values
// reproduces the captured version bit for bit (NOTE [Bitwise equality]):
//   * kInplace and kReassign versions whose value is their producer's output (the
//     producer wrote the whole buffer), which holds by construction;
//   * writes through a slice or a permuted view, redone as alias writes (NOTE [Writes
//     through aliases] in replay.h) from the previous version;
//   * kFused versions (BatchNorm and InstanceNorm running statistics), whose producer,
//     re-run from the previous version, yields the state after the call.
// Every fused version in the cone is recomputed, also one whose value did not change at
// capture (momentum 0 keeps the statistics, but an edited statistic is kept too). A
// version that does not certify keeps its captured value and yields a kBufferThreadGap
// diagnostic, or, under DoOptions::strict, an error and no fork.
//
// NOTE [Values that leave the graph]
// Ops whose results are not tensors (`item`, `size`, comparisons read as a bool) hand
// their value to code the trace does not see: to an `if`, or as a scalar argument of a
// later op (BatchNorm with momentum None averages with 1 / num_batches_tracked through
// `float(...)`). When such an op is re-executed and its non-tensor result differs from
// the captured one, the ops that consumed that value cannot be found, so they keep what
// they computed at capture: `Do` reports a kNonTensorGap naming the op (an error under
// strict), rather than returning values that silently ignore the edit.
#ifndef TORCHLENS_VALIDATION_INTERVENE_H_
#define TORCHLENS_VALIDATION_INTERVENE_H_

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "graph/trace.h"

namespace torchlens {

struct Edit {
  std::string label;  // any key Trace::Find accepts: "relu_1_2:1", "b:1", "buffer_1:2"
  at::Tensor value;   // same shape and dtype as the node's value
  int output = 0;     // which tensor output of the node (`Op::outs`), for ops with several
};

struct DoOptions {
  bool strict = false;  // any gap (a Diagnostic) is an error
  // NOTE [Forks that keep only their results]
  // false: the fork keeps the re-executed values of its outputs and buffer versions only.
  // Every other re-executed node's value (and the arguments it ran on) is dropped once
  // the last op that reads it has been re-executed, so a cone larger than memory is
  // replayed with its working set (the CLI's --edit does so). The fork then holds no
  // values to replay or validate from (`has_saved_values()` is false; ValidateForwardPass
  // and Do refuse it, saying so), and the dropped nodes' `out` is undefined.
  bool keep_values = true;
};

enum class DiagnosticKind {
  kBufferThreadGap,  // a buffer version in the cone kept its captured value
  kNonTensorGap,     // a re-executed op's non-tensor result changed (NOTE [Values that leave the
                     // graph])
  kAliasWriteGap,    // a tensor changed through a view kept its captured value
};

absl::string_view DiagnosticKindName(DiagnosticKind kind);  // "buffer_thread_gap", ...

struct Diagnostic {
  DiagnosticKind kind;
  std::string label;  // the node where the edit stopped
  std::string message;
};

struct DoResult {
  Trace trace;
  std::vector<Diagnostic> warnings;
  std::vector<std::string> reexecuted;  // labels of the re-executed nodes, in order
};

// Errors, with nothing changed: kNotFound / kInvalidArgument for a label Find rejects;
// kInvalidArgument for a value of the wrong shape or dtype, an undefined value, an output
// the node does not have, or two edits of one output; kFailedPrecondition for a trace
// without saved values, for edits that reach ops the capture did not save (a partly saved
// trace: the message names those labels), or a gap under strict; the replay error of a
// cone op that cannot be re-executed.
absl::StatusOr<DoResult> Do(const Trace& trace, std::vector<Edit> edits, DoOptions options = {});

}  // namespace torchlens

#endif  // TORCHLENS_VALIDATION_INTERVENE_H_
