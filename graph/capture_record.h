// What the capture plugin hands the graph library: flat, index-linked records.
//
// The plugin appends to these vectors on the hot path (one `NodeRecord` per node, flat
// pools for arguments, sources and shapes) and never builds strings there; `BuildTrace`
// (build_trace.h) turns a finished record into a labelled `Trace` afterwards.
//
// Indexes: `NodeRecord`s refer to each other by position in `CaptureRecord::nodes`; tensors
// by position in `CaptureRecord::slots`; names by position in the string tables.
#ifndef TORCHLENS_GRAPH_CAPTURE_RECORD_H_
#define TORCHLENS_GRAPH_CAPTURE_RECORD_H_

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/operator_name.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "graph/trace.h"

namespace torchlens {

// The source of one tensor argument, resolved at call time.
struct SourceRecord {
  enum class Kind : uint8_t { kNode, kParam, kConstant, kNone };
  Kind kind = Kind::kNone;
  int32_t index = -1;        // node index (kNode) or param index (kParam)
  int32_t output_index = 0;  // which tensor output of that node
  int32_t slot = -1;         // saved value of the argument (-1 when not saved)
};

// One tensor output of a node: its saved value and metadata kept even without saving.
struct OutputRecord {
  int32_t slot = -1;        // -1 when not saved
  int32_t shape_begin = 0;  // into CaptureRecord::shapes
  int32_t ndim = 0;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
};

// A tensor an op changed through an alias of what it wrote (see AliasWrite in trace.h).
struct AliasWriteRecord {
  SourceRecord before;  // kNode: the changed tensor's value before the write
  int32_t written_tensor = -1;
  TensorGeometry aliased;
  TensorGeometry written;
  int32_t slot = -1;  // the changed tensor after the write; -1 when not saved
};

// When an op ran (CaptureOptions::time_ops), in nanoseconds of a steady clock.
struct OpTiming {
  int32_t node;
  int64_t start_ns;
  int64_t end_ns;
};

struct NodeRecord {
  // What the node is: any OpKind but kBackward (the gradient hooks record backward ops,
  // graph/gradients.h).
  using Kind = OpKind;
  Kind kind = Kind::kOp;
  // kOp: which operator (index into CaptureRecord::operators), its module (index into
  // CaptureRecord::module_addresses) and layer identity (equal ids = the same layer).
  int32_t op = -1;
  int32_t module = 0;
  int32_t layer = -1;
  // kOp: saved arguments [args_begin, args_end) in `args`; tensor sources
  // [sources_begin, sources_end) in `sources`, one per tensor in ForEachTensor order.
  int32_t args_begin = 0, args_end = 0;
  int32_t sources_begin = 0, sources_end = 0;
  // Outputs [outputs_begin, outputs_end) in `outputs` (kOp, kInput, kBufferVersion and
  // kOutput each have at least one).
  int32_t outputs_begin = 0, outputs_end = 0;
  // kBufferVersion: which buffer, how it was written (nullopt = initial read), and for
  // fused writes whether the value changed. kBufferVersion and kOutput: `sources` holds one
  // entry, the producer.
  int32_t buffer = -1;
  std::optional<WriteKind> write_kind;
  std::optional<bool> value_changed;
  // kOp consuming randomness: the generator state before the call (slot), or -1.
  int32_t rng_slot = -1;
  // kOp: tensors it changed through aliases, [alias_writes_begin, alias_writes_end) in
  // `alias_writes`.
  int32_t alias_writes_begin = 0, alias_writes_end = 0;
  // kConstant: the attribute address (index into CaptureRecord::constant_addresses), or -1.
  int32_t constant_address = -1;
};

struct BufferRecord {
  const std::string* address;  // the model layout's, kept alive by CaptureRecord::layout
  int32_t module = 0;          // owning module (index into module_addresses)
  at::Tensor initial_value;    // a copy taken when capture started
  at::Tensor final_value;      // a copy of the last version's value (kept even unsaved)
  // NOTE [Buffers on one storage]: other buffers (indexes into CaptureRecord::buffers) that
  // are the same tensor when capture started, and that share only some of its bytes.
  std::vector<int32_t> same_tensor_as;
  std::vector<int32_t> overlapping;
};

struct CaptureRecord {
  std::vector<NodeRecord> nodes;
  std::vector<c10::IValue> args;      // saved op arguments (see NodeRecord)
  std::vector<SourceRecord> sources;  // tensor argument sources
  std::vector<OutputRecord> outputs;
  std::vector<int64_t> shapes;    // output shapes, concatenated
  std::vector<at::Tensor> slots;  // saved tensor values
  std::vector<AliasWriteRecord> alias_writes;
  std::vector<std::string> constant_addresses;
  std::vector<OpTiming> timings;  // op nodes, in order, when timed
  // A capture that did not record everything (CaptureOptions::halt_after,
  // max_saved_bytes): why, with "{label}" where the label of node `partial_node` goes.
  std::string partial_reason;
  int32_t partial_node = -1;
  bool budget_exceeded = false;  // saving stopped at the memory budget
  // CaptureOptions::value_sink threw on a value of node `sink_failed_node` (its message).
  std::string sink_failure;
  int32_t sink_failed_node = -1;
  // (input node, op node): the op wrote the caller's input tensor, directly or through a
  // view (it becomes a trace diagnostic).
  std::vector<std::pair<int32_t, int32_t>> written_inputs;

  std::vector<c10::OperatorName> operators;  // distinct operators, by first use
  int32_t num_layers = 0;                    // kOp nodes' layer ids are in [0, num_layers)
  // The source position of each layer id (null when unknown), shared by its passes, and
  // what keeps them alive (NOTE [Source positions] in torchlens_dispatch/source_positions.h).
  std::vector<const SourcePosition*> layer_positions;
  std::vector<std::shared_ptr<const void>> source_position_owners;
  // Module ids index `module_addresses` (the model's, shared; 0 is the root ""), then
  // `extra_module_addresses`.
  std::shared_ptr<const std::vector<std::string>> module_addresses;
  std::vector<std::string> extra_module_addresses;
  std::vector<BufferRecord> buffers;  // every registered buffer
  // A buffer's initial read was recorded after one of its writes (NOTE [Former registered
  // tensors] in torchlens_dispatch/buffer_journal.cc): it still is the buffer's version 1.
  bool late_initial_reads = false;
  std::shared_ptr<const void> layout;  // owns the strings BufferRecord::address points to
  // Param ids (SourceRecord::kParam) index this.
  std::shared_ptr<const std::vector<std::string>> param_addresses;
  // A saving capture's parameter arguments by reference, by param id (NOTE [Parameters
  // read by reference] in torchlens_dispatch/parameter_state.h): a kParam source without a slot
  // holds param_slots[id]'s value when that is set (the value from before the forward
  // wrote the parameter), else param_values[id]; null when the capture saves nothing.
  std::shared_ptr<const std::vector<at::Tensor>> param_values;
  std::vector<int32_t> param_slots;
  // Shared by every trace of the model.
  std::shared_ptr<const std::map<std::string, Module>> modules;
  std::shared_ptr<const std::map<std::string, Param>> params;
  std::vector<TraceDiagnostic> diagnostics;
  bool saved_values = false;
  // The values went to a sink instead (NOTE [Streaming without saving] in
  // torchlens_dispatch/capture_options.h): the replay data (arguments, their sources,
  // generator states) is kept as with saved values, with no tensor an op produced.
  bool streamed_values = false;
  bool training = false;
  CaptureStats stats;
  // CaptureOptions::save_grads: the store the autograd hooks fill (graph/gradients.h).
  std::shared_ptr<GradientStore> gradients;
};

}  // namespace torchlens

#endif  // TORCHLENS_GRAPH_CAPTURE_RECORD_H_
