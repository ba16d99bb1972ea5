// Appending nodes to a CaptureRecord (graph/capture_record.h): each node with its ranges
// in the record's pools (sources, arguments, outputs, alias writes), so that no caller
// keeps [begin, end) by hand.
//
// An op node is appended in two phases, around the call it records:
//
//   NodeRecord node = appender.BeginOp();       // before the call
//   appender.AddArgument(...);                   // each saved argument
//   appender.EndArguments(&node, sources);       // or DropArguments(node) on failure
//   ... the call runs ...
//   const int32_t index = appender.AddOp(node);  // after it
//   appender.AddOutput(index, tensor, slot);     // each tensor return
//   appender.AddAliasWrite(index, write);        // each tensor it changed through an alias
//
// Other nodes are appended whole. The hot calls are inline: the recorder makes them for
// every op of the model.
#ifndef TORCHLENS_DISPATCH_RECORD_APPENDER_H_
#define TORCHLENS_DISPATCH_RECORD_APPENDER_H_

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "graph/capture_record.h"
#include "torchlens_dispatch/capture_options.h"
#include "torchlens_dispatch/gradient_hooks.h"
#include "torchlens_dispatch/model_layout.h"

namespace torchlens {

class RecordAppender {
 public:
  RecordAppender(bool saved_values, bool training);
  RecordAppender(const RecordAppender&) = delete;
  RecordAppender& operator=(const RecordAppender&) = delete;

  // The record, for its metadata (operators, buffers, stats, ...).
  CaptureRecord& record() { return record_; }
  const CaptureRecord& record() const { return record_; }

  // Reserves the pools at the sizes of the model's last capture; stores this one's.
  void Reserve(const ModelLayout::CaptureSizes& last);
  void StoreSizes(ModelLayout::CaptureSizes* sizes) const;

  // NOTE [Cold record memory]: asks for the lines ahead of the pools' ends, once per op.
  void PrefetchAhead() const;

  // A saved value (no copy-on-write registration: see Recorder::Save).
  int32_t AddSlot(at::Tensor value) {
    record_.slots.push_back(std::move(value));
    return static_cast<int32_t>(record_.slots.size()) - 1;
  }
  at::Tensor& slot(int32_t index) { return record_.slots[index]; }
  int32_t num_slots() const { return static_cast<int32_t>(record_.slots.size()); }
  // The saved value of node `node`'s first output, or -1.
  int32_t OutputSlot(int32_t node) const {
    return record_.outputs[record_.nodes[node].outputs_begin].slot;
  }
  const NodeRecord& node(int32_t index) const { return record_.nodes[index]; }

  // Op nodes (see the header comment).
  NodeRecord BeginOp() const;
  void AddArgument(c10::IValue argument) { record_.args.push_back(std::move(argument)); }
  // The op's argument sources are appended here, all at once: resolving them may append
  // other nodes with sources of their own (a buffer version found reassigned), which must
  // not fall inside the op's range.
  void EndArguments(NodeRecord* node, c10::ArrayRef<SourceRecord> sources);
  void DropArguments(const NodeRecord& node);
  int32_t AddOp(NodeRecord node);
  // Appends an output to node `index`, the last node appended. Filled in place: a record
  // assembled on the stack and copied in whole would wait, in the copy, for every store
  // before it to reach a cache line that may be cold (NOTE [Cold record memory]).
  void AddOutput(int32_t index, const at::Tensor& tensor, int32_t slot);
  // Appends an alias write to op `writer` (which may be followed by buffer versions, which
  // have none) and returns the output index readers name it by, -(k + 1).
  // `value` is the tensor's value after the write, streamed when the record keeps no
  // values (SetValueSink's `unsaved`).
  int32_t AddAliasWrite(int32_t writer, AliasWriteRecord write, const at::Tensor& value = {});

  // Nodes appended whole. `constant_address` indexes record().constant_addresses (-1: none).
  int32_t AddSourceNode(NodeRecord::Kind kind, const at::Tensor& tensor, int32_t slot,
                        int32_t constant_address = -1);
  // A buffer version; `producer` is null for the initial read.
  int32_t AddBufferVersion(int32_t buffer, std::optional<WriteKind> kind,
                           const SourceRecord* producer, const at::Tensor& value,
                           std::optional<bool> changed, int32_t slot);
  int32_t AddOutputNode(const SourceRecord& source, const at::Tensor& tensor, int32_t slot);

  CaptureRecord Release() { return std::move(record_); }

  // CaptureOptions::save_grads: every value appended is shown to `hooks` (NOTE [Hooking the
  // forward's autograd graph] in gradient_hooks.h), which outlive the appender's use.
  void SetGradientHooks(GradientHooks* hooks) { gradient_hooks_ = hooks; }

  // Hands each saved node value to `sink` as it is appended (NOTE [Streaming saved values]
  // in capture_options.h); `sink` outlives the appender. A sink that throws is dropped and
  // its failure kept in the record (CaptureRecord::sink_failure). With `unsaved` the record
  // keeps no values (its slots are empty, NOTE [Streaming identity]) and the sink receives
  // the tensors appended instead (NOTE [Streaming without saving]).
  // Whether a sink receives values (SetValueSink).
  bool streams() const { return sink_ != nullptr; }
  void SetValueSink(const std::function<void(const StreamedValue&)>* sink, bool unsaved) {
    sink_ = sink;
    stream_unsaved_ = unsaved;
    record_.streamed_values = unsaved;
  }

  // NOTE [Streaming memory written without dispatch]
  // `aten::empty` returns memory it never wrote, and its caller may fill it without
  // dispatching anything: TorchScript's `torch.tensor([1, 1, 3])` is an interpreter op that
  // calls `empty` and then copies the numbers in. The capture sees `empty` and, when it
  // keeps values, holds the tensor the numbers land in; a sink handed that value right
  // after `empty` would get memory never written (a trace file whose index tensors held
  // garbage and read back FAILED). So the values of the op appended next after
  // DeferStreaming(true) are held back, and StreamDeferredValues hands them on before the
  // next op runs (Recorder::Prepare) or at Finish: after any fill done without dispatch,
  // before any dispatched write.
  void DeferStreaming(bool defer) { defer_streaming_ = defer && sink_ != nullptr; }
  bool has_deferred_values() const { return !deferred_.empty(); }
  void StreamDeferredValues();

 private:
  int32_t Size(size_t n) const { return static_cast<int32_t>(n); }
  // Calls the sink with output `output` of node `node`.
  void Stream(int32_t node, int output, const at::Tensor& value);

  CaptureRecord record_;
  GradientHooks* gradient_hooks_ = nullptr;
  const std::function<void(const StreamedValue&)>* sink_ = nullptr;
  bool stream_unsaved_ = false;
  bool defer_streaming_ = false;
  struct DeferredValue {
    int32_t node;
    int output;
    at::Tensor value;  // streamed without saving; otherwise undefined and `slot` saved it
    int32_t slot;
  };
  std::vector<DeferredValue> deferred_;
};

inline void RecordAppender::AddOutput(int32_t index, const at::Tensor& tensor, int32_t slot) {
  OutputRecord& output = record_.outputs.emplace_back();
  output.slot = slot;
  output.shape_begin = Size(record_.shapes.size());
  if (tensor.defined()) {
    const c10::IntArrayRef sizes = tensor.sizes();
    record_.shapes.insert(record_.shapes.end(), sizes.begin(), sizes.end());
    output.ndim = static_cast<int32_t>(sizes.size());
    output.dtype = tensor.scalar_type();
  }
  NodeRecord& node = record_.nodes[index];
  node.outputs_end = Size(record_.outputs.size());
  if (C10_UNLIKELY(gradient_hooks_ != nullptr)) {
    gradient_hooks_->OnValue(record_, index, node.outputs_end - node.outputs_begin - 1, tensor);
  }
  if (C10_UNLIKELY(sink_ != nullptr)) {
    const int output_index = node.outputs_end - node.outputs_begin - 1;
    if (defer_streaming_) {
      // See NOTE [Streaming memory written without dispatch].
      if (stream_unsaved_ ? tensor.defined() : slot >= 0) {
        deferred_.push_back({index, output_index, stream_unsaved_ ? tensor : at::Tensor(), slot});
      }
    } else if (stream_unsaved_) {
      // Slots are empty (NOTE [Streaming identity]); buffer versions have none.
      if (tensor.defined()) Stream(index, output_index, tensor);
    } else if (slot >= 0) {
      Stream(index, output_index, record_.slots[slot]);
    }
  }
}

}  // namespace torchlens

#endif  // TORCHLENS_DISPATCH_RECORD_APPENDER_H_
