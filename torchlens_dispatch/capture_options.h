// Options of a capture (see capture.h).
#ifndef TORCHLENS_DISPATCH_CAPTURE_OPTIONS_H_
#define TORCHLENS_DISPATCH_CAPTURE_OPTIONS_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace torchlens {

// What selective saving and early stop know about an op when they decide.
struct OpQuery {
  std::string_view label;           // "relu_1_2:1", as the trace will name it
  std::string_view type;            // "relu"
  std::string_view module_address;  // the innermost module that runs it ("" the root)
  std::string_view func_name;       // "aten::relu"
};

// What a forward halted by CaptureOptions::halt_after throws from the op where it stops
// (in C++ code; TorchScript's interpreter rethrows it as an error of its own).
class CaptureHalted : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A saved value as CaptureOptions::value_sink receives it.
struct StreamedValue {
  // The node's position in the finished trace's `ops()`, and which of its values: output k
  // (0 for most ops), or -(k + 1) for the tensor it changed through its k-th alias write
  // (`OutputValue(trace.ops()[node], output)` is the same value after Finish).
  int32_t node;
  int output;
  const at::Tensor& value;
};

// The payload URL of Finish's kFailedPrecondition for a buffer changed without a journaled
// write (see `allow_unjournaled_writes`); its value is the buffer's address.
inline constexpr char kUnjournaledWritePayload[] = "torchlens/unjournaled-buffer-write";

struct CaptureOptions {
  // Keep every op's output and the argument values needed to re-run it (replay,
  // validation, interventions). Without it the trace holds the graph, shapes and dtypes.
  bool save_activations = true;
  // Return the trace even when a registered buffer changed without a journaled write
  // (see README "Unjournaled buffer changes"); the change becomes a `Trace::diagnostics()`
  // entry instead of a kFailedPrecondition error.
  bool allow_unjournaled_writes = false;
  // Keep gradients (NOTE [Gradients in a trace] in graph/gradients.h): after backward() on
  // values computed from the outputs, `Op::grad` holds each value's gradient and
  // `Trace::backward_ops()` the ops autograd ran. Collecting them changes nothing autograd
  // computes. Gradients arrive after Finish, so a trace file written during the capture
  // (`trace_file`) holds none: write the trace after the backward (SaveTrace).
  bool save_grads = false;
  // Time every user-level op (`Op::start_ns`, `Op::duration_ns`): two clock reads per op,
  // so off by default. Times include the op's nested calls and the capture's own work.
  bool time_ops = false;

  // NOTE [Selective saving]
  // With save_activations, when any of the four below is set, only the ops they select
  // keep their values (outputs, and the argument values that re-run them); every op stays
  // a node with its metadata. An op is selected when it runs in one of `save_modules` (a
  // module and everything under it: "layer4"), is of one of `save_types` ("conv2d"), has
  // one of `save_labels` (labels are the same from capture to capture of one model on
  // inputs of the same shapes), or `save_if` returns true for it. Buffer versions,
  // inputs and outputs are always saved. Validation checks the selected ops and lists the
  // others as not checked; an intervention needs saved values for the ops in its cone.
  std::vector<std::string> save_modules;
  std::vector<std::string> save_types;
  std::vector<std::string> save_labels;
  std::function<bool(const OpQuery&)> save_if;

  // Early stop: the forward stops right after the first op with this label, or the last
  // op of this module's first call (give a label or a module address). The capture then
  // restores every registered buffer to its value before the forward (a halted forward
  // leaves no half-updated BatchNorm state behind) and its trace is marked partial.
  // `TraceModule` returns that trace; under a CaptureGuard the forward throws (catch it,
  // then call Finish). Parameters written in place by the forward are not restored.
  std::string halt_after;
  // Halt the same way right after the first op whose output holds NaN or Inf (the trace
  // then ends at it: graph/non_finite.h's FirstNonFinite names it with its parents).
  bool stop_at_non_finite = false;

  // Memory budget for the bytes of saved values (each saved tensor's elements; not the
  // parameters, which a trace reads from the model by reference); -1 for no limit. The check runs
  // before each op: the first op to find the budget reached is not saved, nor is any after it (so
  // the op that crossed it, the last one saved, may pass it by its own values). Finish then returns
  // kResourceExhausted naming the op where saving stopped, or with `partial_on_budget` the trace
  // (saved values up to there, metadata for all) marked partial. The model computes what it would
  // have either way.
  int64_t max_saved_bytes = -1;
  bool partial_on_budget = false;

  // NOTE [Streaming saved values]
  // Called on the capturing thread with each saved value of a node (an op's outputs and
  // alias writes, a buffer version, an input, a constant) as soon as the node is recorded:
  // the value is then what the trace will hold for it, and the capture keeps it so (a later
  // in-place write copies it first, NOTE [Copy-on-write of saved values]). The tensor is
  // live: read or copy what you need before returning. Output nodes, which hold their
  // producer's value, and the replay data (argument values saved for selective saving,
  // generator states) are not delivered. Selective saving and the memory budget decide
  // what is saved, hence delivered. A sink that throws is called no more, the forward runs
  // on undisturbed, and Finish returns kAborted naming the node and the exception.
  //
  // NOTE [Streaming without saving]
  // With save_activations = false the sink still receives every value a saved capture
  // would hold (selective saving and the memory budget do not apply), and the capture
  // keeps none: memory stays that of a capture without saved values, whatever the model's
  // size. The value is then the live tensor (it may require grad; detach it), delivered
  // right after its op, before anything can write it. The graph is the one a capture in
  // memory records (NOTE [Streaming identity] in recorder_writes.cc). The trace keeps the
  // replay data (arguments, with a node's tensor left undefined where `arg_sources` names
  // the node, and generator states) and, like a capture without saved values, no tensor
  // values.
  std::function<void(const StreamedValue&)> value_sink;

  // Write the trace to this file as it is captured (a trace file, graph/trace_file.h):
  // each value is copied once recorded and written by a writer thread, at most 8 MiB of
  // copies waiting (NOTE [Writing off the capturing thread] in graph/trace_file_writer.cc),
  // and the capture keeps none (NOTE [Streaming without saving]; save_activations must be
  // true, the default, and no value_sink set). The model's parameters are written by the
  // same thread during the forward, read in place: the forward must not write them.
  // Finish completes the file (written as "<file>.partial", renamed when complete) and
  // returns the trace read back from it with LoadTrace: values are read from disk when
  // used. Capture errors remove the partial file.
  std::string trace_file;
};

}  // namespace torchlens

#endif  // TORCHLENS_DISPATCH_CAPTURE_OPTIONS_H_
