#include "graph/trace.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "graph/gradients.h"
#include "graph/label.h"

namespace torchlens {
namespace {

size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

}  // namespace

absl::string_view WriteKindName(WriteKind kind) {
  switch (kind) {
    case WriteKind::kReassign:
      return "reassign";
    case WriteKind::kInplace:
      return "inplace";
    case WriteKind::kFused:
      return "fused";
  }
  return "unknown";
}

std::string FormatSourcePosition(const SourcePosition& position, bool short_file) {
  absl::string_view file = position.file;
  if (short_file) {
    const size_t slash = file.rfind('/');
    if (slash != absl::string_view::npos) file.remove_prefix(slash + 1);
  }
  return absl::StrCat(file, ":", position.line);
}

absl::string_view ArgSourceKindName(ArgSource::Kind kind) {
  switch (kind) {
    case ArgSource::Kind::kNode:
      return "node";
    case ArgSource::Kind::kParam:
      return "param";
    case ArgSource::Kind::kConstant:
      return "constant";
    case ArgSource::Kind::kNone:
      return "none";
  }
  return "none";
}

const at::Tensor& OutputValue(const Op& op, int output_index) {
  static const at::Tensor* const kUndefined = new at::Tensor();
  if (output_index < 0) {
    const size_t k = static_cast<size_t>(-(output_index + 1));
    return k < op.alias_writes.size() ? op.alias_writes[k].value : *kUndefined;
  }
  if (op.outs.empty()) return output_index == 0 ? op.out : *kUndefined;
  return static_cast<size_t>(output_index) < op.outs.size() ? op.outs[output_index] : *kUndefined;
}

absl::StatusOr<at::Tensor> Buffer::value_at(int n) const {
  const int count = static_cast<int>(versions.size());
  if (n < 1 || n > count) {
    return absl::OutOfRangeError(
        count == 0 ? absl::StrCat("value_at(", n, ") on buffer \"", address,
                                  "\": it has no observed versions (never read or written)")
                   : absl::StrCat("value_at(", n, ") on buffer \"", address,
                                  "\": valid versions are 1..", count));
  }
  const Op* version = versions[n - 1];
  if (!version->out.defined()) {
    return absl::FailedPreconditionError(
        absl::StrCat("buffer \"", address, "\" version ", n,
                     " has no saved value; capture with CaptureOptions::save_activations = true"));
  }
  return version->out;
}

absl::StatusOr<at::Tensor> Buffer::value_after(int n) const {
  if (n < 1 || n > num_overwrites) {
    return absl::OutOfRangeError(num_overwrites == 0
                                     ? absl::StrCat("value_after(", n, ") on buffer \"", address,
                                                    "\": it was never written during capture")
                                     : absl::StrCat("value_after(", n, ") on buffer \"", address,
                                                    "\": valid writes are 1..", num_overwrites));
  }
  // Versions are the optional initial read followed by one per write.
  const int read_versions = static_cast<int>(versions.size()) - num_overwrites;
  return value_at(read_versions + n);
}

// Parts() builds `other`'s graph first and copies it; Assemble relinks the copy's buffer
// projections to the copy's own ops.
Trace::Trace(const Trace& other) : Trace(Assemble(other.Parts())) {}

// NOTE [Destroying a trace]
// A trace owns a few heap blocks per op (labels longer than the string's inline buffer,
// `parents` and `children`), and freeing a block reads its header. The ops built last are
// the ones still in cache when a trace is dropped right after its capture (the common
// case: inspect, then drop), so the ops are destroyed from the back, which is faster on
// traces larger than the L2 cache and costs nothing on small ones.
// A trace whose graph was never built frees only its capture record.
Trace::~Trace() {
  if (graph_ == nullptr) return;
  if (graph_->gradients != nullptr) graph_->gradients->Detach(&graph_->ops);
  std::vector<Op>& ops = graph_->ops;
  while (!ops.empty()) ops.pop_back();
}

// A graph replaced by a move assignment goes without ~Trace: its store must let go of it
// too (NOTE [Gradients in a trace]).
Trace::Graph::~Graph() {
  if (gradients != nullptr) gradients->Detach(&ops);
}

Trace& Trace::operator=(const Trace& other) {
  if (this != &other) {
    Trace copy(other);
    *this = std::move(copy);
  }
  return *this;
}

// See NOTE [Graphs built on first use].
const Trace::Graph& Trace::graph() const {
  static const Graph* const kNone = new Graph();
  if (graph_ == nullptr) return *kNone;  // a moved-from trace has no ops
  Graph& graph = *graph_;
  absl::call_once(graph.built, [&graph] {
    if (!graph.build) return;
    // Frees what the builder held (the capture record) when it returns.
    absl::AnyInvocable<TraceParts()> build = std::exchange(graph.build, nullptr);
    std::string failure;
    try {
      AdoptGraph(std::move(build)(), graph);
      return;
    } catch (const std::exception& e) {
      failure = e.what();
    } catch (...) {
      failure = "an exception that is not a std::exception";
    }
    graph.ops.clear();
    graph.buffers.clear();
    graph.partial_reason =
        absl::StrCat("building this trace's graph failed (", failure,
                     "), so it holds no ops; capture again, saving fewer values if memory ran out "
                     "(CaptureOptions::save_activations, save_modules, max_saved_bytes)");
    graph.diagnostics = {TraceDiagnostic{"", graph.partial_reason, ""}};
    graph.failed.store(true, std::memory_order_release);
  });
  return graph;
}

void Trace::AdoptGraph(TraceParts parts, Graph& graph) {
  graph.ops = std::move(parts.ops);
  graph.buffers = std::move(parts.buffers);
  graph.diagnostics = std::move(parts.diagnostics);
  graph.partial_reason = std::move(parts.partial_reason);
  graph.backward_ops = std::move(parts.backward_ops);
  graph.param_grads = std::move(parts.param_grads);
  graph.records_gradients = graph.records_gradients || parts.records_gradients;
  if (parts.gradients != nullptr) graph.gradients = std::move(parts.gradients);
  std::vector<Op>& ops = graph.ops;
  for (Op& op : ops) op.is_buffer = op.is_buffer_version();
  if (!parts.children_linked) {
    absl::flat_hash_map<absl::string_view, int> labels;
    labels.reserve(ops.size());
    for (size_t i = 0; i < ops.size(); ++i) labels.emplace(ops[i].label, static_cast<int>(i));
    for (Op& op : ops) {
      op.children.clear();
      op.child_indices.clear();
    }
    for (size_t i = 0; i < ops.size(); ++i) {
      Op& op = ops[i];
      op.parent_indices.clear();
      for (const std::string& parent : op.parents) {
        auto it = labels.find(parent);
        op.parent_indices.push_back(it == labels.end() ? -1 : it->second);
        if (it == labels.end()) continue;
        Op& from = ops[it->second];
        from.children.push_back(op.label);
        from.child_indices.push_back(static_cast<int32_t>(i));
      }
    }
    const auto position = [&labels](const ArgSource& source) -> int32_t {
      if (source.kind != ArgSource::Kind::kNode) return -1;
      auto it = labels.find(source.name);
      return it == labels.end() ? -1 : it->second;
    };
    for (Op& op : ops) {
      for (size_t s = 0; s < op.arg_sources.size(); ++s) {
        // Written only when it changes: a fork's sources are shared with its original's.
        const int32_t node = position(op.arg_sources[s]);
        if (op.arg_sources[s].node != node) op.arg_sources.mutable_at(s).node = node;
      }
      for (AliasWrite& write : op.alias_writes) write.before.node = position(write.before);
    }
  }
  LinkBuffers(graph);
  if (graph.gradients != nullptr) {
    graph.records_gradients = true;
    graph.gradients->Attach(&graph.ops, &graph.backward_ops, &graph.param_grads);
  }
}

Trace Trace::WithoutGraph(TraceParts& parts, bool partial) {
  Trace trace;
  if (parts.modules) trace.modules_ = std::move(parts.modules);
  if (parts.params) trace.params_ = std::move(parts.params);
  trace.has_saved_values_ = parts.has_saved_values;
  trace.training_ = parts.training;
  trace.partial_ = partial;
  trace.stats_ = parts.stats;
  trace.graph_->records_gradients = parts.records_gradients || parts.gradients != nullptr;
  if (parts.gradients != nullptr) trace.graph_->gradients = std::move(parts.gradients);
  return trace;
}

Trace Trace::Assemble(TraceParts parts) {
  Trace trace = WithoutGraph(parts, !parts.partial_reason.empty());
  AdoptGraph(std::move(parts), *trace.graph_);
  return trace;
}

Trace Trace::Deferred(TraceParts known, bool partial, absl::AnyInvocable<TraceParts()> build) {
  Trace trace = WithoutGraph(known, partial);
  trace.graph_->build = std::move(build);
  return trace;
}

TraceParts Trace::Parts(bool gradients_follow) const {
  const Graph& graph = this->graph();
  TraceParts parts;
  parts.ops = graph.ops;
  for (const auto& [address, buffer] : graph.buffers) {
    Buffer& copy = parts.buffers.emplace_hint(parts.buffers.end(), address, Buffer())->second;
    copy.address = buffer.address;
    copy.initial_value = buffer.initial_value;
    copy.final_value = buffer.final_value;  // kept when the last version is unsaved
    copy.module_address = buffer.module_address;
    copy.same_tensor_as = buffer.same_tensor_as;
    copy.shares_storage_with = buffer.shares_storage_with;
    // `versions` and `num_overwrites` point into this trace: Assemble recomputes them
    // from the fork's own ops.
  }
  parts.modules = modules_;
  parts.params = params_;
  parts.diagnostics = graph.diagnostics;
  parts.has_saved_values = has_saved_values_;
  parts.training = training_;
  parts.stats = stats_;
  parts.partial_reason = graph.partial_reason;
  parts.children_linked = true;
  // A snapshot: the store keeps filling this trace only (NOTE [Gradients in a trace]).
  parts.backward_ops = graph.backward_ops;
  parts.param_grads = graph.param_grads;
  parts.records_gradients = graph.records_gradients;
  if (gradients_follow) parts.gradients = graph.gradients;
  return parts;
}

// See NOTE [Lazy label index].
const absl::flat_hash_map<absl::string_view, int>& Trace::by_label() const {
  static const auto* const kNone = new absl::flat_hash_map<absl::string_view, int>();
  if (label_index_ == nullptr) return *kNone;  // a moved-from trace has no ops
  LabelIndex& index = *label_index_;
  const std::vector<Op>& ops = graph().ops;
  absl::call_once(index.built, [&] {
    index.positions.reserve(ops.size());
    for (size_t i = 0; i < ops.size(); ++i) {
      index.positions.emplace(absl::string_view(ops[i].label), static_cast<int>(i));
    }
  });
  return index.positions;
}

void Trace::LinkBuffers(Graph& graph) {
  std::map<std::string, Buffer>& buffers = graph.buffers;
  if (buffers.empty()) return;  // no pass over the ops of a model without buffers
  for (auto& [address, buffer] : buffers) {
    buffer.versions.clear();
    buffer.num_overwrites = 0;
  }
  for (const Op& op : graph.ops) {
    if (!op.is_buffer_version()) continue;
    auto it = buffers.find(op.address);
    if (it == buffers.end()) continue;
    it->second.versions.push_back(&op);
    if (op.buffer_write_kind.has_value()) ++it->second.num_overwrites;
  }
  for (auto& [address, buffer] : buffers) {
    std::stable_sort(buffer.versions.begin(), buffer.versions.end(),
                     [](const Op* a, const Op* b) { return a->buffer_pass < b->buffer_pass; });
    // `initial_value` stays the independent copy the capture took: validation compares the
    // read version with it (NOTE [Independent initial values]).
    if (buffer.versions.empty()) {
      buffer.final_value = buffer.initial_value;
    } else if (buffer.versions.back()->out.defined()) {
      buffer.final_value = buffer.versions.back()->out;
    }  // else unsaved: keep the copy the capture recorded
  }
}

int Trace::IndexOfLabel(absl::string_view label) const {
  const absl::flat_hash_map<absl::string_view, int>& labels = by_label();
  auto it = labels.find(label);
  return it == labels.end() ? -1 : it->second;
}

ArgSource NodeSource(const std::vector<Op>& ops, int32_t node, int output_index) {
  if (node < 0 || static_cast<size_t>(node) >= ops.size()) {
    return ArgSource{ArgSource::Kind::kNode, std::string(), output_index, -1};
  }
  return ArgSource{ArgSource::Kind::kNode, ops[node].label, output_index, node};
}

const Op* SourceNode(const std::vector<Op>& ops, const ArgSource& source) {
  if (source.kind != ArgSource::Kind::kNode || source.node < 0 ||
      static_cast<size_t>(source.node) >= ops.size()) {
    return nullptr;
  }
  return &ops[source.node];
}

bool SameSource(const ArgSource& a, const ArgSource& b) {
  if (a.kind != b.kind || a.output_index != b.output_index) return false;
  return a.kind == ArgSource::Kind::kNode ? a.node >= 0 && a.node == b.node : a.name == b.name;
}

OpKind OpKindOf(absl::string_view type, bool is_buffer) {
  if (is_buffer) return OpKind::kBufferVersion;
  if (type == "input") return OpKind::kInput;
  if (type == "output") return OpKind::kOutput;
  if (type == "constant") return OpKind::kConstant;
  return OpKind::kOp;
}

int Trace::IndexOf(const Op* op) const {
  const std::vector<Op>& ops = this->ops();
  if (ops.empty() || op < ops.data() || op >= ops.data() + ops.size()) return -1;
  return static_cast<int>(op - ops.data());
}

absl::StatusOr<const Op*> Trace::Find(absl::string_view key) const {
  absl::StatusOr<ParsedKey> parsed = ParseKey(key);
  if (!parsed.ok()) return parsed.status();

  const Graph& graph = this->graph();
  const absl::flat_hash_map<absl::string_view, int>& labels = by_label();
  if (auto it = labels.find(key); it != labels.end()) return &graph.ops[it->second];

  // A buffer address, with or without a version.
  if (auto it = graph.buffers.find(parsed->base); it != graph.buffers.end()) {
    const Buffer& buffer = it->second;
    const int count = static_cast<int>(buffer.versions.size());
    if (parsed->pass.has_value()) {
      if (*parsed->pass > count) {
        return absl::NotFoundError(
            absl::StrCat("buffer \"", buffer.address, "\" has no version ", *parsed->pass,
                         count == 0 ? "; it was never read or written during capture"
                                    : absl::StrCat("; its versions are 1..", count)));
      }
      return buffer.versions[*parsed->pass - 1];
    }
    if (count == 1) return buffer.versions.front();
    if (count == 0) {
      return absl::NotFoundError(
          absl::StrCat("buffer \"", buffer.address, "\" was never read or written during capture"));
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "key \"", key, "\" is ambiguous: buffer \"", buffer.address, "\" has ", count,
        " versions; use \"", buffer.address, ":1\" .. \"", buffer.address, ":", count, "\""));
  }

  // A layer label without its pass.
  if (!parsed->pass.has_value()) {
    const std::string prefix = absl::StrCat(parsed->base, ":");
    std::vector<const Op*> passes;
    for (const Op& op : graph.ops) {
      if (absl::string_view(op.label).substr(0, prefix.size()) == prefix) passes.push_back(&op);
    }
    if (passes.size() == 1) return passes.front();
    if (passes.size() > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "key \"", key, "\" is ambiguous: layer \"", parsed->base, "\" ran ", passes.size(),
          " times; use \"", passes.front()->label, "\" .. \"", passes.back()->label, "\""));
    }
  }

  // Unknown: suggest the closest labels and addresses.
  std::vector<std::pair<size_t, std::string>> scored;
  absl::flat_hash_set<std::string> seen;
  auto consider = [&](const std::string& name) {
    if (seen.insert(name).second) scored.emplace_back(EditDistance(key, name), name);
  };
  // Buffer versions by address ("calls:2"), as the summary and pictures name them.
  for (const Op& op : graph.ops) {
    consider(op.is_buffer_version() ? absl::StrCat(op.address, ":", op.buffer_pass) : op.label);
  }
  for (const auto& [address, buffer] : graph.buffers) consider(address);
  std::sort(scored.begin(), scored.end());
  std::vector<std::string> closest;
  for (size_t i = 0; i < scored.size() && i < 3; ++i) closest.push_back(scored[i].second);
  return absl::NotFoundError(
      absl::StrCat("label \"", key, "\" not found",
                   closest.empty() ? std::string("; the trace is empty")
                                   : absl::StrCat("; closest: ", absl::StrJoin(closest, ", "))));
}

std::vector<const Op*> Trace::buffer_read_ops() const {
  std::vector<const Op*> result;
  for (const Op& op : ops()) {
    if (op.is_buffer_version() && !op.buffer_write_kind.has_value()) result.push_back(&op);
  }
  return result;
}

std::vector<const Op*> Trace::buffer_write_ops() const {
  std::vector<const Op*> result;
  for (const Op& op : ops()) {
    if (op.is_buffer_version() && op.buffer_write_kind.has_value()) result.push_back(&op);
  }
  return result;
}

std::vector<const Op*> Trace::backward_ops() const {
  std::vector<const Op*> result;
  const std::vector<Op>& ops = graph().backward_ops;
  result.reserve(ops.size());
  for (const Op& op : ops) result.push_back(&op);
  return result;
}

bool Trace::records_gradients() const { return graph().records_gradients; }

std::vector<std::string> Trace::input_labels() const {
  std::vector<std::string> result;
  for (const Op& op : ops()) {
    if (op.is_input()) result.push_back(op.label);
  }
  return result;
}

std::vector<std::string> Trace::output_labels() const {
  std::vector<std::string> result;
  for (const Op& op : ops()) {
    if (op.is_output()) result.push_back(op.label);
  }
  return result;
}

}  // namespace torchlens
