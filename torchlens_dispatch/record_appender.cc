#include "torchlens_dispatch/record_appender.h"

#include <c10/core/impl/LocalDispatchKeySet.h>

#include <atomic>
#include <exception>
#include <utility>

#include "torchlens_dispatch/ops/capture_key.h"
#include "torchlens_dispatch/ops/exception_text.h"

namespace torchlens {
namespace {

// NOTE [Cold record memory]
// A capture reserves its record vectors at the sizes of the model's last capture, in
// memory the last trace freed. On a model larger than the L2 cache the forward passes
// since then have evicted it, so every new cache line of every vector is a miss when the
// recorder first writes it, a few per op. Once per op the recorder asks for the line
// 512 bytes past the end of each vector, for writing, so that the line is on its way
// several ops before it is needed.
template <typename T>
void PrefetchAppend(const std::vector<T>& records) {
  constexpr uintptr_t kBytesAhead = 512;
  // An address, not a pointer into the vector: it may lie past the allocation, which a
  // prefetch (it never faults) may name.
  const uintptr_t end = reinterpret_cast<uintptr_t>(records.data() + records.size());
  __builtin_prefetch(reinterpret_cast<const void*>(end + kBytesAhead), /*rw=*/1);
}

}  // namespace

RecordAppender::RecordAppender(bool saved_values, bool training) {
  record_.saved_values = saved_values;
  record_.training = training;
}

void RecordAppender::Reserve(const ModelLayout::CaptureSizes& last) {
  constexpr auto kRelaxed = std::memory_order_relaxed;
  record_.nodes.reserve(last.nodes.load(kRelaxed));
  record_.args.reserve(last.args.load(kRelaxed));
  record_.sources.reserve(last.sources.load(kRelaxed));
  record_.outputs.reserve(last.outputs.load(kRelaxed));
  record_.shapes.reserve(last.shapes.load(kRelaxed));
  if (record_.saved_values) record_.slots.reserve(last.slots.load(kRelaxed));
}

void RecordAppender::StoreSizes(ModelLayout::CaptureSizes* sizes) const {
  constexpr auto kRelaxed = std::memory_order_relaxed;
  sizes->nodes.store(static_cast<uint32_t>(record_.nodes.size()), kRelaxed);
  sizes->args.store(static_cast<uint32_t>(record_.args.size()), kRelaxed);
  sizes->sources.store(static_cast<uint32_t>(record_.sources.size()), kRelaxed);
  sizes->outputs.store(static_cast<uint32_t>(record_.outputs.size()), kRelaxed);
  sizes->shapes.store(static_cast<uint32_t>(record_.shapes.size()), kRelaxed);
  sizes->slots.store(static_cast<uint32_t>(record_.slots.size()), kRelaxed);
}

void RecordAppender::PrefetchAhead() const {
  PrefetchAppend(record_.nodes);
  PrefetchAppend(record_.sources);
  PrefetchAppend(record_.outputs);
  PrefetchAppend(record_.shapes);
}

NodeRecord RecordAppender::BeginOp() const {
  NodeRecord node;
  node.kind = NodeRecord::Kind::kOp;
  node.args_begin = Size(record_.args.size());
  return node;
}

void RecordAppender::EndArguments(NodeRecord* node, c10::ArrayRef<SourceRecord> sources) {
  node->args_end = Size(record_.args.size());
  node->sources_begin = Size(record_.sources.size());
  record_.sources.insert(record_.sources.end(), sources.begin(), sources.end());
  node->sources_end = Size(record_.sources.size());
}

void RecordAppender::DropArguments(const NodeRecord& node) { record_.args.resize(node.args_begin); }

int32_t RecordAppender::AddOp(NodeRecord node) {
  node.outputs_begin = node.outputs_end = Size(record_.outputs.size());
  node.alias_writes_begin = node.alias_writes_end = Size(record_.alias_writes.size());
  record_.nodes.push_back(node);
  return Size(record_.nodes.size()) - 1;
}

int32_t RecordAppender::AddAliasWrite(int32_t writer, AliasWriteRecord write,
                                      const at::Tensor& value) {
  const int32_t slot = write.slot;
  record_.alias_writes.push_back(std::move(write));
  NodeRecord& node = record_.nodes[writer];
  node.alias_writes_end = Size(record_.alias_writes.size());
  const int32_t output = -(node.alias_writes_end - node.alias_writes_begin);
  if (sink_ != nullptr) {
    if (stream_unsaved_) {
      if (value.defined()) Stream(writer, output, value);
    } else if (slot >= 0) {
      Stream(writer, output, record_.slots[slot]);
    }
  }
  return output;
}

void RecordAppender::StreamDeferredValues() {
  // See NOTE [Streaming memory written without dispatch].
  // Stream appends nothing, so the list is walked in place (keeping its capacity).
  for (const DeferredValue& value : deferred_) {
    if (sink_ == nullptr) break;
    Stream(value.node, value.output, stream_unsaved_ ? value.value : record_.slots[value.slot]);
  }
  deferred_.clear();
}

void RecordAppender::Stream(int32_t node, int output, const at::Tensor& value) {
  // Output nodes hold their producer's value, which the sink already had.
  if (record_.nodes[node].kind == NodeRecord::Kind::kOutput) return;
  // The sink's own ops (a copy of the value, ...) are not the model's.
  c10::impl::ExcludeDispatchKeyGuard not_captured(kCaptureKey);
  const std::function<void(const StreamedValue&)>& sink = *sink_;
  try {
    sink(StreamedValue{node, output, value});
    return;
  } catch (const std::exception& e) {
    record_.sink_failure = FirstLine(e);
  } catch (...) {
    record_.sink_failure = "an exception that is not a std::exception";
  }
  // NOTE [Streaming saved values]: called no more; the forward is not disturbed.
  record_.sink_failed_node = node;
  sink_ = nullptr;
}

int32_t RecordAppender::AddSourceNode(NodeRecord::Kind kind, const at::Tensor& tensor, int32_t slot,
                                      int32_t constant_address) {
  NodeRecord node;
  node.kind = kind;
  node.constant_address = constant_address;
  node.sources_begin = node.sources_end = Size(record_.sources.size());
  const int32_t index = AddOp(node);
  AddOutput(index, tensor, slot);
  return index;
}

int32_t RecordAppender::AddBufferVersion(int32_t buffer, std::optional<WriteKind> kind,
                                         const SourceRecord* producer, const at::Tensor& value,
                                         std::optional<bool> changed, int32_t slot) {
  NodeRecord node;
  node.kind = NodeRecord::Kind::kBufferVersion;
  node.buffer = buffer;
  node.write_kind = kind;
  node.value_changed = changed;
  node.sources_begin = Size(record_.sources.size());
  if (producer != nullptr) record_.sources.push_back(*producer);
  node.sources_end = Size(record_.sources.size());
  const int32_t index = AddOp(node);
  AddOutput(index, value, slot);
  return index;
}

int32_t RecordAppender::AddOutputNode(const SourceRecord& source, const at::Tensor& tensor,
                                      int32_t slot) {
  NodeRecord node;
  node.kind = NodeRecord::Kind::kOutput;
  node.sources_begin = Size(record_.sources.size());
  record_.sources.push_back(source);
  node.sources_end = Size(record_.sources.size());
  const int32_t index = AddOp(node);
  AddOutput(index, tensor, slot);
  return index;
}

}  // namespace torchlens
