// Options of a capture (see capture.h).
#ifndef TORCHLENS_DISPATCH_CAPTURE_OPTIONS_H_
#define TORCHLENS_DISPATCH_CAPTURE_OPTIONS_H_

namespace torchlens {

struct CaptureOptions {
  // Keep every op's output and the argument values needed to re-run it (replay,
  // validation, interventions). Without it the trace holds the graph, shapes and dtypes.
  bool save_activations = true;
  // Return the trace even when a registered buffer changed without a journaled write
  // (see README "Unjournaled buffer changes"); the change becomes a `Trace::diagnostics()`
  // entry instead of a kFailedPrecondition error.
  bool allow_unjournaled_writes = false;
  // Time every user-level op (`Op::start_ns`, `Op::duration_ns`): two clock reads per op,
  // so off by default. Times include the op's nested calls and the capture's own work.
  bool time_ops = false;
};

}  // namespace torchlens

#endif  // TORCHLENS_DISPATCH_CAPTURE_OPTIONS_H_
