#include "graph/build_trace.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "graph/label.h"
#include "graph/layer_numbering.h"
#include "graph/shared_vector.h"
#include "torchlens_dispatch/ops/ivalue_tensors.h"
#include "torchlens_dispatch/ops/op_names.h"

namespace torchlens {
namespace {

// The graph of a finished capture: labels, edges and replay data (see build_trace.h). One
// use: Build consumes the record.
class GraphBuilder {
 public:
  explicit GraphBuilder(CaptureRecord record);
  GraphBuilder(const GraphBuilder&) = delete;
  GraphBuilder& operator=(const GraphBuilder&) = delete;

  TraceParts Build() &&;

 private:
  const std::string& ModuleAddress(int32_t id) const {
    const std::vector<std::string>& base = *record_.module_addresses;
    return id < static_cast<int32_t>(base.size())
               ? base[id]
               : record_.extra_module_addresses[id - base.size()];
  }

  // The steps of one node, in order.
  void Name(const NodeRecord& node, Op& op);
  void FillOutputs(const NodeRecord& node, Op& op);
  void Link(size_t n, const NodeRecord& node, Op& op);
  void FillParamsAndSources(size_t n, const NodeRecord& node, Op& op);
  void FillAliasWrites(size_t n, const NodeRecord& node, Op& op);
  void FillSavedArguments(const NodeRecord& node, Op& op);

  // The steps after every node.
  void AddTimings();
  void AddAddressMetadata();
  void AddDiagnostics();

  CaptureRecord record_;
  TraceParts parts_;
  // Outputs (undefined when streamed), argument sources, arguments, generator states.
  bool replay_data_;

  // Buffer numbers in order of first appearance; versions counted per buffer.
  std::vector<int> buffer_number_;
  std::vector<int> buffer_versions_;
  // An initial read recorded after a write of its buffer is still its version 1, and the
  // writes follow it (CaptureRecord::late_initial_reads).
  std::vector<char> has_initial_read_;
  // Layer numbers (graph/layer_numbering.h), and per distinct operator (not per op) its
  // type name and type id.
  LayerNumbering numbering_;
  std::vector<std::string> operator_types_;
  std::vector<int32_t> operator_type_ids_;
  // How many nodes of each kind were labelled so far: the next one's number.
  struct Counts {
    int inputs = 0;
    int outputs = 0;
    int constants = 0;
    int buffers = 0;
  } counts_;
  // One owner for every op's source position (NOTE [Source positions] in
  // torchlens_dispatch/source_positions.h): each op's reference counts on this one hot
  // block instead of on its position's own, which the forward has evicted.
  std::shared_ptr<const void> positions_owner_;
  // NOTE [Vectors built in one arena] in graph/shared_vector.h: each op's replay data.
  struct Arenas {
    Arenas(size_t nodes, const CaptureRecord& record)
        : outs(nodes, record.outputs.size()),
          args(nodes, record.args.size()),
          sources(nodes, record.sources.size()) {}
    SharedVectorArena<at::Tensor> outs;
    SharedVectorArena<c10::IValue> args;
    SharedVectorArena<ArgSource> sources;
  };
  std::optional<Arenas> arenas_;
  // The node being linked's parents (Link), kept to reuse its storage.
  absl::InlinedVector<int32_t, 8> parent_indices_;
};

GraphBuilder::GraphBuilder(CaptureRecord record)
    : record_(std::move(record)),
      replay_data_(record_.saved_values || record_.streamed_values),
      buffer_number_(record_.buffers.size(), 0),
      buffer_versions_(record_.buffers.size(), 0) {
  const std::vector<NodeRecord>& nodes = record_.nodes;
  // Each op is constructed when its node is reached, so that it is filled while its lines
  // are in cache; the reservation keeps parents' addresses stable for their children.
  parts_.ops.reserve(nodes.size());
  if (record_.late_initial_reads) {
    has_initial_read_.assign(record_.buffers.size(), 0);
    for (const NodeRecord& node : nodes) {
      if (node.kind == NodeRecord::Kind::kBufferVersion && !node.write_kind.has_value()) {
        has_initial_read_[node.buffer] = 1;
      }
    }
  }
  numbering_.Reserve(record_.num_layers);
  operator_types_.reserve(record_.operators.size());
  operator_type_ids_.reserve(record_.operators.size());
  for (const c10::OperatorName& name : record_.operators) {
    operator_types_.push_back(OpTypeName(name));
    operator_type_ids_.push_back(numbering_.TypeId(operator_types_.back()));
  }
  if (!record_.source_position_owners.empty()) {
    positions_owner_ = std::make_shared<const std::vector<std::shared_ptr<const void>>>(
        std::move(record_.source_position_owners));
  }
  if (replay_data_) {
    arenas_.emplace(nodes.size(), record_);
  }
}

TraceParts GraphBuilder::Build() && {
  // NOTE [Node order]
  // One pass in execution order: every source names an earlier node (a producer is
  // recorded before any reader of its output), so a parent's label exists when its reader
  // is labelled, and children are appended in execution order without a lookup.
  const std::vector<NodeRecord>& nodes = record_.nodes;
  for (size_t n = 0; n < nodes.size(); ++n) {
    const NodeRecord& node = nodes[n];
    Op& op = parts_.ops.emplace_back();
    Name(node, op);
    FillOutputs(node, op);
    Link(n, node, op);
    FillParamsAndSources(n, node, op);
    if (node.kind != NodeRecord::Kind::kOp) continue;
    FillAliasWrites(n, node, op);
    if (replay_data_) FillSavedArguments(node, op);
  }
  AddTimings();
  AddAddressMetadata();
  AddDiagnostics();
  parts_.has_saved_values = record_.saved_values;
  parts_.training = record_.training;
  parts_.stats = record_.stats;
  parts_.partial_reason = record_.partial_reason;
  if (const size_t at = parts_.partial_reason.find("{label}"); at != std::string::npos) {
    parts_.partial_reason.replace(
        at, 7,
        record_.partial_node >= 0 && record_.partial_node < static_cast<int32_t>(parts_.ops.size())
            ? parts_.ops[record_.partial_node].label
            : std::string("the start"));
  }
  parts_.children_linked = true;
  return std::move(parts_);
}

// The node's type, kind and label, and what its kind knows: a buffer version's address and
// pass, an op's operator, module, layer numbers and source position.
void GraphBuilder::Name(const NodeRecord& node, Op& op) {
  switch (node.kind) {
    case NodeRecord::Kind::kBackward:  // never recorded (see NodeRecord::Kind)
      break;
    case NodeRecord::Kind::kInput:
      op.type = "input";
      op.kind = OpKind::kInput;
      op.label = absl::StrCat("input_", ++counts_.inputs);
      break;
    case NodeRecord::Kind::kOutput:
      op.type = "output";
      op.kind = OpKind::kOutput;
      op.label = absl::StrCat("output_", ++counts_.outputs);
      break;
    case NodeRecord::Kind::kConstant:
      op.type = "constant";
      op.kind = OpKind::kConstant;
      op.label = absl::StrCat("constant_", ++counts_.constants);
      if (node.constant_address >= 0)
        op.address = record_.constant_addresses[node.constant_address];
      break;
    case NodeRecord::Kind::kBufferVersion: {
      const BufferRecord& buffer = record_.buffers[node.buffer];
      if (buffer_number_[node.buffer] == 0) buffer_number_[node.buffer] = ++counts_.buffers;
      op.type = "buffer";
      op.kind = OpKind::kBufferVersion;
      op.address = *buffer.address;
      if (has_initial_read_.empty()) {
        op.buffer_pass = ++buffer_versions_[node.buffer];
      } else {
        op.buffer_pass = node.write_kind.has_value()
                             ? ++buffer_versions_[node.buffer] + has_initial_read_[node.buffer]
                             : 1;
      }
      op.buffer_write_kind = node.write_kind;
      op.buffer_value_changed = node.value_changed;
      op.module_address = ModuleAddress(buffer.module);
      op.pass = op.buffer_pass;
      op.label = BufferPassLabel(buffer_number_[node.buffer], op.buffer_pass);
      break;
    }
    case NodeRecord::Kind::kOp: {
      const c10::OperatorName& name = record_.operators[node.op];
      op.type = operator_types_[node.op];
      op.func_name = name.name;
      op.overload_name = name.overload_name;
      op.module_address = ModuleAddress(node.module);
      const LayerNumbering::Numbers numbers =
          numbering_.Next(node.layer, operator_type_ids_[node.op]);
      op.pass = numbers.pass;
      op.layer_type_index = numbers.type_index;
      op.layer_step_index = numbers.step_index;
      op.label = LayerPassLabel(op.type, numbers.type_index, numbers.step_index, op.pass);
      if (static_cast<size_t>(node.layer) < record_.layer_positions.size() &&
          record_.layer_positions[node.layer] != nullptr) {
        op.source_position = std::shared_ptr<const SourcePosition>(
            positions_owner_, record_.layer_positions[node.layer]);
      }
      break;
    }
  }
}

void GraphBuilder::FillOutputs(const NodeRecord& node, Op& op) {
  if (replay_data_) op.outs = arenas_->outs.Make(node.outputs_end - node.outputs_begin);
  for (int32_t i = node.outputs_begin; i < node.outputs_end; ++i) {
    const OutputRecord& output = record_.outputs[i];
    at::Tensor value = output.slot >= 0 ? record_.slots[output.slot] : at::Tensor();
    if (i == node.outputs_begin) {
      op.out = value;
      op.tensor_shape.assign(record_.shapes.begin() + output.shape_begin,
                             record_.shapes.begin() + output.shape_begin + output.ndim);
      if (output.dtype != c10::ScalarType::Undefined) {
        op.tensor_dtype = c10::toString(output.dtype);
      }
    }
    if (replay_data_) op.outs.push_back(std::move(value));
  }
}

// Edges: node `n`'s parents, each once, and it as their child.
void GraphBuilder::Link(size_t n, const NodeRecord& node, Op& op) {
  parent_indices_.clear();
  for (int32_t s = node.sources_begin; s < node.sources_end; ++s) {
    const SourceRecord& source = record_.sources[s];
    // A source that names no earlier node (NOTE [Node order]) would be a capture bug; it
    // makes no edge rather than reading an op not built yet.
    if (source.kind != SourceRecord::Kind::kNode || source.index < 0 ||
        source.index >= static_cast<int32_t>(n) ||
        std::find(parent_indices_.begin(), parent_indices_.end(), source.index) !=
            parent_indices_.end()) {
      continue;
    }
    parent_indices_.push_back(source.index);
  }
  // The earlier values of the tensors it changed through aliases come after the
  // arguments: the changed tensors' new values depend on them.
  for (int32_t w = node.alias_writes_begin; w < node.alias_writes_end; ++w) {
    const int32_t before = record_.alias_writes[w].before.index;
    if (before >= 0 && before < static_cast<int32_t>(n) &&
        std::find(parent_indices_.begin(), parent_indices_.end(), before) ==
            parent_indices_.end()) {
      parent_indices_.push_back(before);
    }
  }
  op.parents.reserve(parent_indices_.size());
  for (int32_t parent : parent_indices_) {
    op.parents.push_back(parts_.ops[parent].label);
    op.parent_indices.push_back(parent);
    parts_.ops[parent].children.push_back(op.label);
    parts_.ops[parent].child_indices.push_back(static_cast<int32_t>(n));
  }
}

// The parameters it read, and its argument sources. Argument sources are replay data: kept
// with saved values only. The one source of an output or a written buffer version says
// which output of its parent it is (negative: an alias write, NOTE [Writes through views]).
void GraphBuilder::FillParamsAndSources(size_t n, const NodeRecord& node, Op& op) {
  const bool keep_sources = node.kind != NodeRecord::Kind::kInput &&
                            node.kind != NodeRecord::Kind::kConstant && replay_data_;
  if (keep_sources) op.arg_sources = arenas_->sources.Make(node.sources_end - node.sources_begin);
  int num_params = 0;
  for (int32_t s = node.sources_begin; s < node.sources_end; ++s) {
    if (record_.sources[s].kind == SourceRecord::Kind::kParam) ++num_params;
  }
  op.parent_params.reserve(num_params);
  for (int32_t s = node.sources_begin; s < node.sources_end; ++s) {
    const SourceRecord& source = record_.sources[s];
    if (source.kind == SourceRecord::Kind::kParam) {
      op.parent_params.push_back((*record_.param_addresses)[source.index]);
    }
    if (!keep_sources) continue;
    switch (source.kind) {
      case SourceRecord::Kind::kNode:
        op.arg_sources.push_back(
            NodeSource(parts_.ops, source.index < static_cast<int32_t>(n) ? source.index : -1,
                       source.output_index));
        break;
      case SourceRecord::Kind::kParam:
        op.arg_sources.push_back(ArgSource{ArgSource::Kind::kParam,
                                           (*record_.param_addresses)[source.index],
                                           source.output_index});
        break;
      case SourceRecord::Kind::kConstant:
        op.arg_sources.push_back(
            ArgSource{ArgSource::Kind::kConstant, std::string(), source.output_index});
        break;
      case SourceRecord::Kind::kNone:
        op.arg_sources.push_back(
            ArgSource{ArgSource::Kind::kNone, std::string(), source.output_index});
        break;
    }
  }
}

void GraphBuilder::FillAliasWrites(size_t n, const NodeRecord& node, Op& op) {
  op.alias_writes.reserve(node.alias_writes_end - node.alias_writes_begin);
  for (int32_t w = node.alias_writes_begin; w < node.alias_writes_end; ++w) {
    const AliasWriteRecord& write = record_.alias_writes[w];
    AliasWrite& alias = op.alias_writes.emplace_back();
    if (write.before.index >= 0 && write.before.index < static_cast<int32_t>(n)) {
      alias.before = NodeSource(parts_.ops, write.before.index, write.before.output_index);
    }
    alias.written_tensor = write.written_tensor;
    alias.aliased = write.aliased;
    alias.written = write.written;
    if (write.slot >= 0) alias.value = record_.slots[write.slot];
  }
}

// Its generator state and its arguments as it read them: each tensor argument is the value
// saved for its source where one was, else the live one.
void GraphBuilder::FillSavedArguments(const NodeRecord& node, Op& op) {
  if (node.rng_slot >= 0) op.rng_state = record_.slots[node.rng_slot];
  int32_t next_source = node.sources_begin;
  auto saved_argument = [&](const at::Tensor& live) -> at::Tensor {
    if (next_source >= node.sources_end) return live;
    const SourceRecord& source = record_.sources[next_source++];
    if (source.slot >= 0) return record_.slots[source.slot];
    if (source.kind == SourceRecord::Kind::kParam && record_.param_values != nullptr) {
      const size_t param = static_cast<size_t>(source.index);
      if (param < record_.param_slots.size() && record_.param_slots[param] >= 0) {
        return record_.slots[record_.param_slots[param]];
      }
      if (param < record_.param_values->size()) return (*record_.param_values)[param];
    }
    return live;
  };
  op.creation_args = arenas_->args.Make(node.args_end - node.args_begin);
  for (int32_t a = node.args_begin; a < node.args_end; ++a) {
    op.creation_args.push_back(MapTensors(record_.args[a], saved_argument));
  }
}

void GraphBuilder::AddTimings() {
  if (record_.timings.empty()) return;
  const int64_t origin = record_.timings.front().start_ns;
  for (const OpTiming& timing : record_.timings) {
    if (timing.node < 0 || timing.node >= static_cast<int32_t>(parts_.ops.size())) continue;
    parts_.ops[timing.node].start_ns = timing.start_ns - origin;
    parts_.ops[timing.node].duration_ns = timing.end_ns - timing.start_ns;
  }
}

// Address-level metadata; modules and parameters are shared with the model's layout.
void GraphBuilder::AddAddressMetadata() {
  for (const BufferRecord& buffer : record_.buffers) {
    Buffer& entry = parts_.buffers[*buffer.address];
    entry.address = *buffer.address;
    entry.initial_value = buffer.initial_value;
    entry.final_value = buffer.final_value;
    entry.module_address = ModuleAddress(buffer.module);
    for (int32_t other : buffer.same_tensor_as) {
      entry.same_tensor_as.push_back(*record_.buffers[other].address);
    }
    for (int32_t other : buffer.overlapping) {
      entry.shares_storage_with.push_back(*record_.buffers[other].address);
    }
  }
  parts_.modules = std::move(record_.modules);
  parts_.params = std::move(record_.params);
}

// The capture's diagnostics, and one per input the forward wrote in place.
void GraphBuilder::AddDiagnostics() {
  parts_.diagnostics = std::move(record_.diagnostics);
  for (const auto& [input, writer] : record_.written_inputs) {
    const std::string& input_label = parts_.ops[input].label;
    parts_.diagnostics.push_back(TraceDiagnostic{
        "",
        absl::StrCat(parts_.ops[writer].label, " wrote the caller's input tensor ", input_label,
                     " in place (directly or through a view): ", input_label,
                     " holds its value before the write, and the tensor passed in holds the "
                     "value after it. Clone the input before the forward to keep it"),
        input_label});
  }
}

}  // namespace

Trace BuildTrace(CaptureRecord record) {
  TraceParts known;
  known.modules = record.modules;
  known.params = record.params;
  known.has_saved_values = record.saved_values;
  known.training = record.training;
  known.stats = record.stats;
  known.gradients = std::move(record.gradients);  // NOTE [Gradients in a trace]
  const bool partial = !record.partial_reason.empty();
  // The record's buffer addresses point into the model's layout, which holds the model's
  // parameters: a trace kept unread must not keep them alive after the model is gone. The
  // addresses are copied, and the layout let go.
  auto addresses = std::make_shared<std::vector<std::string>>();
  addresses->reserve(record.buffers.size());
  for (const BufferRecord& buffer : record.buffers) addresses->push_back(*buffer.address);
  for (size_t b = 0; b < record.buffers.size(); ++b) record.buffers[b].address = &(*addresses)[b];
  record.layout = std::move(addresses);
  return Trace::Deferred(std::move(known), partial, [record = std::move(record)]() mutable {
    return GraphBuilder(std::move(record)).Build();
  });
}

}  // namespace torchlens
