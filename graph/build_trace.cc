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

// The graph of a finished capture: labels, edges and replay data (see build_trace.h).
TraceParts BuildGraph(CaptureRecord record) {
  auto module_address = [&record](int32_t id) -> const std::string& {
    const std::vector<std::string>& base = *record.module_addresses;
    return id < static_cast<int32_t>(base.size()) ? base[id]
                                                  : record.extra_module_addresses[id - base.size()];
  };
  const std::vector<NodeRecord>& nodes = record.nodes;
  TraceParts parts;
  std::vector<Op>& ops = parts.ops;
  // Each op is constructed when its node is reached, so that it is filled while its lines
  // are in cache; the reservation keeps parents' addresses stable for their children.
  ops.reserve(nodes.size());

  // Buffer numbers in order of first appearance; versions counted per buffer.
  std::vector<int> buffer_number(record.buffers.size(), 0);
  std::vector<int> buffer_versions(record.buffers.size(), 0);
  int buffers_seen = 0;
  // An initial read recorded after a write of its buffer is still its version 1, and the
  // writes follow it (CaptureRecord::late_initial_reads).
  std::vector<char> has_initial_read;
  if (record.late_initial_reads) {
    has_initial_read.assign(record.buffers.size(), 0);
    for (const NodeRecord& node : record.nodes) {
      if (node.kind == NodeRecord::Kind::kBufferVersion && !node.write_kind.has_value()) {
        has_initial_read[node.buffer] = 1;
      }
    }
  }
  // Layer numbers (graph/layer_numbering.h), and per distinct operator (not per op) its
  // type name and type id.
  LayerNumbering numbering;
  numbering.Reserve(record.num_layers);
  std::vector<std::string> operator_types;
  std::vector<int32_t> operator_type_ids;
  operator_types.reserve(record.operators.size());
  operator_type_ids.reserve(record.operators.size());
  for (const c10::OperatorName& name : record.operators) {
    operator_types.push_back(OpTypeName(name));
    operator_type_ids.push_back(numbering.TypeId(operator_types.back()));
  }
  int inputs = 0;
  int outputs = 0;
  int constants = 0;
  // Outputs (undefined when streamed), argument sources, arguments, generator states.
  const bool replay_data = record.saved_values || record.streamed_values;
  // One owner for every op's source position (NOTE [Source positions] in
  // torchlens_dispatch/source_positions.h): each op's reference counts on this one hot
  // block instead of on its position's own, which the forward has evicted.
  std::shared_ptr<const void> positions_owner;
  if (!record.source_position_owners.empty()) {
    positions_owner = std::make_shared<const std::vector<std::shared_ptr<const void>>>(
        std::move(record.source_position_owners));
  }

  // NOTE [Vectors built in one arena] in graph/shared_vector.h: each op's replay data.
  std::optional<SharedVectorArena<at::Tensor>> outs_arena;
  std::optional<SharedVectorArena<c10::IValue>> args_arena;
  std::optional<SharedVectorArena<ArgSource>> sources_arena;
  if (replay_data) {
    outs_arena.emplace(nodes.size(), record.outputs.size());
    args_arena.emplace(nodes.size(), record.args.size());
    sources_arena.emplace(nodes.size(), record.sources.size());
  }

  auto fill_outputs = [&](const NodeRecord& node, Op& op) {
    if (replay_data) op.outs = outs_arena->Make(node.outputs_end - node.outputs_begin);
    for (int32_t i = node.outputs_begin; i < node.outputs_end; ++i) {
      const OutputRecord& output = record.outputs[i];
      at::Tensor value = output.slot >= 0 ? record.slots[output.slot] : at::Tensor();
      if (i == node.outputs_begin) {
        op.out = value;
        op.tensor_shape.assign(record.shapes.begin() + output.shape_begin,
                               record.shapes.begin() + output.shape_begin + output.ndim);
        if (output.dtype != c10::ScalarType::Undefined) {
          op.tensor_dtype = c10::toString(output.dtype);
        }
      }
      if (replay_data) op.outs.push_back(std::move(value));
    }
  };

  // NOTE [Node order]
  // One pass in execution order: every source names an earlier node (a producer is
  // recorded before any reader of its output), so a parent's label exists when its reader
  // is labelled, and children are appended in execution order without a lookup.
  absl::InlinedVector<int32_t, 8> parent_indices;
  for (size_t n = 0; n < nodes.size(); ++n) {
    const NodeRecord& node = nodes[n];
    Op& op = ops.emplace_back();
    switch (node.kind) {
      case NodeRecord::Kind::kBackward:  // never recorded (see NodeRecord::Kind)
        break;
      case NodeRecord::Kind::kInput:
        op.type = "input";
        op.kind = OpKind::kInput;
        op.label = absl::StrCat("input_", ++inputs);
        break;
      case NodeRecord::Kind::kOutput:
        op.type = "output";
        op.kind = OpKind::kOutput;
        op.label = absl::StrCat("output_", ++outputs);
        break;
      case NodeRecord::Kind::kConstant:
        op.type = "constant";
        op.kind = OpKind::kConstant;
        op.label = absl::StrCat("constant_", ++constants);
        if (node.constant_address >= 0)
          op.address = record.constant_addresses[node.constant_address];
        break;
      case NodeRecord::Kind::kBufferVersion: {
        const BufferRecord& buffer = record.buffers[node.buffer];
        if (buffer_number[node.buffer] == 0) buffer_number[node.buffer] = ++buffers_seen;
        op.type = "buffer";
        op.kind = OpKind::kBufferVersion;
        op.address = *buffer.address;
        if (has_initial_read.empty()) {
          op.buffer_pass = ++buffer_versions[node.buffer];
        } else {
          op.buffer_pass = node.write_kind.has_value()
                               ? ++buffer_versions[node.buffer] + has_initial_read[node.buffer]
                               : 1;
        }
        op.buffer_write_kind = node.write_kind;
        op.buffer_value_changed = node.value_changed;
        op.module_address = module_address(buffer.module);
        op.pass = op.buffer_pass;
        op.label = BufferPassLabel(buffer_number[node.buffer], op.buffer_pass);
        break;
      }
      case NodeRecord::Kind::kOp: {
        const c10::OperatorName& name = record.operators[node.op];
        op.type = operator_types[node.op];
        op.func_name = name.name;
        op.overload_name = name.overload_name;
        op.module_address = module_address(node.module);
        const LayerNumbering::Numbers numbers =
            numbering.Next(node.layer, operator_type_ids[node.op]);
        op.pass = numbers.pass;
        op.layer_type_index = numbers.type_index;
        op.layer_step_index = numbers.step_index;
        op.label = LayerPassLabel(op.type, numbers.type_index, numbers.step_index, op.pass);
        if (static_cast<size_t>(node.layer) < record.layer_positions.size() &&
            record.layer_positions[node.layer] != nullptr) {
          op.source_position = std::shared_ptr<const SourcePosition>(
              positions_owner, record.layer_positions[node.layer]);
        }
        break;
      }
    }
    fill_outputs(node, op);

    // Edges and saved arguments. Argument sources are replay data: kept with saved values
    // only. The one source of an output or a written buffer version says which output of
    // its parent it is (negative: an alias write, NOTE [Writes through views]).
    const bool keep_sources = node.kind != NodeRecord::Kind::kInput &&
                              node.kind != NodeRecord::Kind::kConstant && replay_data;
    if (keep_sources) op.arg_sources = sources_arena->Make(node.sources_end - node.sources_begin);
    parent_indices.clear();
    int num_params = 0;
    for (int32_t s = node.sources_begin; s < node.sources_end; ++s) {
      const SourceRecord& source = record.sources[s];
      if (source.kind == SourceRecord::Kind::kParam) ++num_params;
      // A source that names no earlier node (NOTE [Node order]) would be a capture bug; it
      // makes no edge rather than reading an op not built yet.
      if (source.kind != SourceRecord::Kind::kNode || source.index < 0 ||
          source.index >= static_cast<int32_t>(n) ||
          std::find(parent_indices.begin(), parent_indices.end(), source.index) !=
              parent_indices.end()) {
        continue;
      }
      parent_indices.push_back(source.index);
    }
    // The earlier values of the tensors it changed through aliases come after the
    // arguments: the changed tensors' new values depend on them.
    for (int32_t w = node.alias_writes_begin; w < node.alias_writes_end; ++w) {
      const int32_t before = record.alias_writes[w].before.index;
      if (before >= 0 && before < static_cast<int32_t>(n) &&
          std::find(parent_indices.begin(), parent_indices.end(), before) == parent_indices.end()) {
        parent_indices.push_back(before);
      }
    }
    op.parents.reserve(parent_indices.size());
    for (int32_t parent : parent_indices) {
      op.parents.push_back(ops[parent].label);
      op.parent_indices.push_back(parent);
      ops[parent].children.push_back(op.label);
      ops[parent].child_indices.push_back(static_cast<int32_t>(n));
    }
    op.parent_params.reserve(num_params);
    for (int32_t s = node.sources_begin; s < node.sources_end; ++s) {
      const SourceRecord& source = record.sources[s];
      if (source.kind == SourceRecord::Kind::kParam) {
        op.parent_params.push_back((*record.param_addresses)[source.index]);
      }
      if (!keep_sources) continue;
      switch (source.kind) {
        case SourceRecord::Kind::kNode:
          op.arg_sources.push_back(
              NodeSource(ops, source.index < static_cast<int32_t>(n) ? source.index : -1,
                         source.output_index));
          break;
        case SourceRecord::Kind::kParam:
          op.arg_sources.push_back(ArgSource{ArgSource::Kind::kParam,
                                             (*record.param_addresses)[source.index],
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
    if (node.kind != NodeRecord::Kind::kOp) continue;
    op.alias_writes.reserve(node.alias_writes_end - node.alias_writes_begin);
    for (int32_t w = node.alias_writes_begin; w < node.alias_writes_end; ++w) {
      const AliasWriteRecord& write = record.alias_writes[w];
      AliasWrite& alias = op.alias_writes.emplace_back();
      if (write.before.index >= 0 && write.before.index < static_cast<int32_t>(n)) {
        alias.before = NodeSource(ops, write.before.index, write.before.output_index);
      }
      alias.written_tensor = write.written_tensor;
      alias.aliased = write.aliased;
      alias.written = write.written;
      if (write.slot >= 0) alias.value = record.slots[write.slot];
    }
    if (!replay_data) continue;
    if (node.rng_slot >= 0) op.rng_state = record.slots[node.rng_slot];
    int32_t next_source = node.sources_begin;
    auto saved_argument = [&](const at::Tensor& live) -> at::Tensor {
      if (next_source >= node.sources_end) return live;
      const SourceRecord& source = record.sources[next_source++];
      if (source.slot >= 0) return record.slots[source.slot];
      if (source.kind == SourceRecord::Kind::kParam && record.param_values != nullptr) {
        const size_t param = static_cast<size_t>(source.index);
        if (param < record.param_slots.size() && record.param_slots[param] >= 0) {
          return record.slots[record.param_slots[param]];
        }
        if (param < record.param_values->size()) return (*record.param_values)[param];
      }
      return live;
    };
    op.creation_args = args_arena->Make(node.args_end - node.args_begin);
    for (int32_t a = node.args_begin; a < node.args_end; ++a) {
      op.creation_args.push_back(MapTensors(record.args[a], saved_argument));
    }
  }

  if (!record.timings.empty()) {
    const int64_t origin = record.timings.front().start_ns;
    for (const OpTiming& timing : record.timings) {
      if (timing.node < 0 || timing.node >= static_cast<int32_t>(ops.size())) continue;
      ops[timing.node].start_ns = timing.start_ns - origin;
      ops[timing.node].duration_ns = timing.end_ns - timing.start_ns;
    }
  }

  // Address-level metadata; modules and parameters are shared with the model's layout.
  for (const BufferRecord& buffer : record.buffers) {
    Buffer& entry = parts.buffers[*buffer.address];
    entry.address = *buffer.address;
    entry.initial_value = buffer.initial_value;
    entry.final_value = buffer.final_value;
    entry.module_address = module_address(buffer.module);
    for (int32_t other : buffer.same_tensor_as) {
      entry.same_tensor_as.push_back(*record.buffers[other].address);
    }
    for (int32_t other : buffer.overlapping) {
      entry.shares_storage_with.push_back(*record.buffers[other].address);
    }
  }
  parts.modules = std::move(record.modules);
  parts.params = std::move(record.params);
  parts.diagnostics = std::move(record.diagnostics);
  for (const auto& [input, writer] : record.written_inputs) {
    const std::string& input_label = ops[input].label;
    parts.diagnostics.push_back(TraceDiagnostic{
        "",
        absl::StrCat(ops[writer].label, " wrote the caller's input tensor ", input_label,
                     " in place (directly or through a view): ", input_label,
                     " holds its value before the write, and the tensor passed in holds the "
                     "value after it. Clone the input before the forward to keep it"),
        input_label});
  }
  parts.has_saved_values = record.saved_values;
  parts.training = record.training;
  parts.stats = record.stats;
  parts.partial_reason = record.partial_reason;
  if (const size_t at = parts.partial_reason.find("{label}"); at != std::string::npos) {
    parts.partial_reason.replace(
        at, 7,
        record.partial_node >= 0 && record.partial_node < static_cast<int32_t>(ops.size())
            ? ops[record.partial_node].label
            : std::string("the start"));
  }
  parts.children_linked = true;
  return parts;
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
    return BuildGraph(std::move(record));
  });
}

}  // namespace torchlens
