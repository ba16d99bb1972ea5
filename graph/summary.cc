#include "graph/summary.h"

#include <algorithm>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "graph/gradient_norms.h"
#include "graph/op_timing.h"

namespace torchlens {
namespace {

// Rows of cells printed as left-aligned columns.
class Table {
 public:
  void Add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  std::string Render(const std::string& indent) const {
    std::vector<size_t> widths;
    for (const auto& row : rows_) {
      widths.resize(std::max(widths.size(), row.size()));
      for (size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
    }
    std::string out;
    for (const auto& row : rows_) {
      std::string line = indent;
      for (size_t c = 0; c < row.size(); ++c) {
        absl::StrAppend(&line, row[c]);
        if (c + 1 < row.size()) line.append(widths[c] - row[c].size() + 2, ' ');
      }
      while (!line.empty() && line.back() == ' ') line.pop_back();
      absl::StrAppend(&out, line, "\n");
    }
    return out;
  }

 private:
  std::vector<std::vector<std::string>> rows_;
};

std::string ModuleColumn(const std::string& address) { return address.empty() ? "-" : address; }

// A gradient's norm, "-" when none reached it.
std::string NormColumn(const at::Tensor& grad) {
  const std::optional<double> norm = GradNorm(grad);
  return norm.has_value() ? absl::StrFormat("%.4g", *norm) : "-";
}

// NOTE [Gradients in a trace] in graph/gradients.h: the gradient norm per module and the
// backward ops of the latest backward.
std::string GradientSections(const Trace& trace) {
  const std::vector<const Op*> backward = trace.backward_ops();
  if (backward.empty() && trace.param_grads().empty()) {
    return "\nGradients: none (no backward() reached the trace yet)\n";
  }
  std::string out = absl::StrCat(
      "\nGradient norm per module (its parameters', submodules "
      "included), from the latest backward:\n");
  Table modules;
  modules.Add({"module", "grad norm"});
  for (const auto& [address, norm] : ModuleGradNorms(trace)) {
    modules.Add({address.empty() ? "(model)" : address, absl::StrFormat("%.4g", norm)});
  }
  absl::StrAppend(&out, modules.Render("  "));
  absl::StrAppend(&out, "\nBackward ops: ", backward.size(), ", in execution order\n");
  Table ops;
  ops.Add({"label", "differentiates", "module", "grad shape", "parents"});
  for (const Op* op : backward) {
    ops.Add({op->label, op->address.empty() ? op->forward_label : op->address,
             ModuleColumn(op->module_address), FormatShape(op->tensor_shape),
             absl::StrJoin(op->parents, ", ")});
  }
  absl::StrAppend(&out, ops.Render("  "));
  return out;
}

// "linear.py:114", then each branch it ran in: "model.py:20 (then of :14)".
std::string SourceColumn(const Op& op, bool library_branches) {
  if (op.source_position == nullptr) return "-";
  std::string column = FormatSourcePosition(*op.source_position, /*short_file=*/true);
  for (const BranchTaken& branch : op.source_position->branches) {
    if (!library_branches && LibraryFile(branch.file)) continue;
    absl::StrAppend(&column, " (", branch.then ? "then" : "else", " of :", branch.line, ")");
  }
  return column;
}

}  // namespace

std::string FormatShape(c10::IntArrayRef shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

namespace {

// "1 op", "2 ops".
std::string Counted(int64_t count, absl::string_view singular, absl::string_view plural) {
  return absl::StrCat(count, " ", count == 1 ? singular : plural);
}

}  // namespace

std::string NodeName(const Op& op) {
  return op.is_buffer_version() ? absl::StrCat(op.address, ":", op.buffer_pass) : op.label;
}

bool LibraryFile(absl::string_view file) {
  return absl::StrContains(file, "/site-packages/") || absl::StrContains(file, "/dist-packages/");
}

std::string FormatSummary(const Trace& trace, bool library_branches) {
  std::string out;
  int compute = 0;
  for (const Op& op : trace.ops()) compute += op.is_compute() ? 1 : 0;
  const int64_t versions = trace.buffer_read_ops().size() + trace.buffer_write_ops().size();
  absl::StrAppend(&out, "Ops: ", Counted(trace.ops().size(), "node", "nodes"), " (",
                  Counted(compute, "op", "ops"), ", ",
                  Counted(versions, "buffer version", "buffer versions"), "), ",
                  trace.training() ? "training" : "eval", " mode\n");
  if (trace.partial()) absl::StrAppend(&out, "Partial trace: ", trace.partial_reason(), "\n");
  int unsaved = 0;
  for (const Op& op : trace.ops())
    unsaved += trace.has_saved_values() && op.is_compute() && !op.saved();
  if (unsaved > 0) {
    absl::StrAppend(&out, "Values saved for ", compute - unsaved, " of ",
                    Counted(compute, "op", "ops"), " (selective saving or the memory budget)\n");
  }
  // TorchScript traces say where each op is in the model's code, and which `if` branches
  // it ran in (SourcePosition); other traces have no such column.
  const bool has_positions = std::any_of(trace.ops().begin(), trace.ops().end(),
                                         [](const Op& op) { return op.source_position; });
  Table ops;
  std::vector<std::string> header = {"label", "type", "shape", "dtype", "module", "parents"};
  if (has_positions) header.insert(header.end() - 1, "source");
  // CaptureOptions::save_grads: each value's gradient norm after the latest backward.
  const bool grads = trace.records_gradients();
  if (grads) header.insert(header.end() - 1, "grad norm");
  ops.Add(std::move(header));
  // Buffer versions by address and version, as pictures and TorchLens name them
  // ("calls:2"); their labels ("buffer_1:2") are accepted by Trace::Find too.
  const auto name_of = [&trace](const std::string& label) {
    const int index = trace.IndexOfLabel(label);
    return index < 0 ? label : NodeName(trace.ops()[index]);
  };
  for (const Op& op : trace.ops()) {
    std::string type = op.type;
    if (op.is_buffer_version()) {
      type = absl::StrCat(
          "buffer (", op.buffer_write_kind ? WriteKindName(*op.buffer_write_kind) : "read", ")");
    }
    std::vector<std::string> parents;
    for (const std::string& parent : op.parents) parents.push_back(name_of(parent));
    for (const std::string& param : op.parent_params) parents.push_back(param);
    std::vector<std::string> row = {NodeName(op),
                                    type,
                                    FormatShape(op.tensor_shape),
                                    op.tensor_dtype,
                                    ModuleColumn(op.module_address),
                                    absl::StrJoin(parents, ", ")};
    if (has_positions) row.insert(row.end() - 1, SourceColumn(op, library_branches));
    if (grads) row.insert(row.end() - 1, NormColumn(op.grad));
    ops.Add(std::move(row));
  }
  absl::StrAppend(&out, ops.Render("  "));

  int64_t values = 0;
  for (const auto& [address, param] : trace.params()) {
    int64_t count = 1;  // trace files refuse shapes whose product overflows
    for (int64_t d : param.shape) count *= d;
    if (__builtin_add_overflow(values, count, &values)) values = INT64_MAX;
  }
  absl::StrAppend(&out, "\nParameters: ", trace.params().size(), " (",
                  Counted(values, "value", "values"), ")\n");
  Table params;
  params.Add({"address", "shape", "module"});
  for (const auto& [address, param] : trace.params()) {
    params.Add({address, FormatShape(param.shape), ModuleColumn(param.module_address)});
  }
  if (!trace.params().empty()) absl::StrAppend(&out, params.Render("  "));

  absl::StrAppend(&out, "\nBuffers: ", trace.buffers().size(), "\n");
  Table buffers;
  buffers.Add({"address", "shape", "versions", "writes", "kinds"});
  for (const auto& [address, buffer] : trace.buffers()) {
    std::vector<std::string> kinds;
    for (const Op* version : buffer.versions) {
      if (version->buffer_write_kind) {
        std::string kind(WriteKindName(*version->buffer_write_kind));
        if (version->buffer_value_changed.has_value() && !*version->buffer_value_changed) {
          absl::StrAppend(&kind, "(unchanged)");
        }
        kinds.push_back(kind);
      }
    }
    buffers.Add(
        {address,
         buffer.initial_value.defined() ? FormatShape(buffer.initial_value.sizes().vec()) : "",
         absl::StrCat(buffer.versions.size()), absl::StrCat(buffer.num_overwrites),
         kinds.empty() ? (buffer.versions.empty() ? "unused" : "read only")
                       : absl::StrJoin(kinds, ", ")});
  }
  if (!trace.buffers().empty()) absl::StrAppend(&out, buffers.Render("  "));
  if (grads) absl::StrAppend(&out, GradientSections(trace));
  for (const TraceDiagnostic& diagnostic : trace.diagnostics()) {
    absl::StrAppend(&out, "\nDiagnostic (", diagnostic.address, "): ", diagnostic.message, "\n");
  }
  if (HasOpTimes(trace)) {
    // CaptureOptions::time_ops: where the time went, by module (submodules included).
    absl::StrAppend(&out, "\nTime per module (ops timed, nested calls included):\n");
    Table times;
    times.Add({"module", "time"});
    for (const auto& [address, ns] : ModuleTotals(trace)) {
      times.Add({address.empty() ? "(whole forward)" : address,
                 absl::StrFormat("%.1f us", static_cast<double>(ns) / 1e3)});
    }
    absl::StrAppend(&out, times.Render("  "));
  }
  return out;
}

}  // namespace torchlens
