// The writing half of graph/trace_file.h: the value SaveTrace pickles, and SaveTrace.

#include <ATen/core/Dict.h>
#include <ATen/core/List.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "graph/buffer_summary.h"
#include "graph/file_io.h"
#include "graph/one_dtype_per_storage.h"
#include "graph/op_fields.h"
#include "graph/trace_file.h"

namespace torchlens {
namespace {

using Dict = c10::impl::GenericDict;
using List = c10::impl::GenericList;

Dict NewDict() { return Dict(c10::StringType::get(), c10::AnyType::get()); }
List NewList() { return List(c10::AnyType::get()); }

c10::IValue Strings(absl::Span<const std::string> values) {
  c10::List<std::string> list;
  for (const std::string& value : values) list.push_back(value);
  return list;
}

c10::IValue Ints(c10::IntArrayRef values) { return c10::List<int64_t>(values); }

c10::IValue TensorOrNone(const at::Tensor& t) {
  return t.defined() ? c10::IValue(t) : c10::IValue();
}

// Argument values the pickler writes and Python reads back.
bool Picklable(const c10::IValue& value) {
  if (value.isNone() || value.isTensor() || value.isDouble() || value.isInt() || value.isBool() ||
      value.isString() || value.isComplexDouble() || value.isDevice()) {
    return true;
  }
  if (value.isList()) {
    for (const c10::IValue& element : value.toListRef()) {
      if (!Picklable(element)) return false;
    }
    return true;
  }
  if (value.isTuple()) {
    for (const c10::IValue& element : value.toTupleRef().elements()) {
      if (!Picklable(element)) return false;
    }
    return true;
  }
  return false;
}

c10::IValue SourceToIValue(const ArgSource& source) {
  return c10::ivalue::Tuple::create({std::string(ArgSourceKindName(source.kind)), source.name,
                                     static_cast<int64_t>(source.output_index)});
}

c10::IValue GeometryToIValue(const TensorGeometry& geometry) {
  Dict d = NewDict();
  d.insert("sizes", Ints(geometry.sizes));
  d.insert("strides", Ints(geometry.strides));
  d.insert("storage_offset", geometry.storage_offset);
  return d;
}

// A tensor Python's torch.load could not read back, or nullptr. LibTorch 1.13 pickles a
// sparse tensor as a call of torch._utils._rebuild_sparse_tensor with arguments that
// Python's function of that name does not take; other layouts (MKL-DNN) it cannot pickle.
const char* UnsavableLayout(const c10::IValue& value) {
  if (value.isTensor()) {
    const at::Tensor& t = value.toTensor();
    if (!t.defined() || t.layout() == at::kStrided) return nullptr;
    return t.is_sparse() ? "sparse" : "non-strided";
  }
  if (value.isList()) {
    for (const c10::IValue& element : value.toListRef()) {
      if (const char* layout = UnsavableLayout(element)) return layout;
    }
  }
  if (value.isTuple()) {
    for (const c10::IValue& element : value.toTupleRef().elements()) {
      if (const char* layout = UnsavableLayout(element)) return layout;
    }
  }
  return nullptr;
}

// Every tensor the file would hold must be one Python reads (UnsavableLayout).
absl::Status CheckSavable(const Trace& trace) {
  auto refuse = [](absl::string_view where, const char* layout) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot write a trace file: ", where, " holds a ", layout,
        " tensor, and trace files hold strided tensors only (LibTorch 1.13 writes sparse "
        "tensors in a form Python's torch.load cannot read); capture with "
        "save_activations = false (--no_save), or make the model return dense tensors"));
  };
  for (const Op& op : trace.ops()) {
    const std::string where = absl::StrCat("op '", op.label, "'");
    for (const at::Tensor& t : op.outs) {
      if (const char* layout = UnsavableLayout(t)) return refuse(where, layout);
    }
    for (const c10::IValue& arg : op.creation_args) {
      if (const char* layout = UnsavableLayout(arg)) {
        return refuse(absl::StrCat("an argument of ", where), layout);
      }
    }
    for (const at::Tensor& t : {op.out, op.rng_state, op.grad}) {
      if (const char* layout = UnsavableLayout(t)) return refuse(where, layout);
    }
    for (const at::Tensor& t : op.grads) {
      if (const char* layout = UnsavableLayout(t)) return refuse(where, layout);
    }
  }
  for (const auto& [address, grad] : trace.param_grads()) {
    if (const char* layout = UnsavableLayout(grad)) {
      return refuse(absl::StrCat("the gradient of parameter '", address, "'"), layout);
    }
  }
  for (const auto& [address, buffer] : trace.buffers()) {
    for (const at::Tensor& t : {buffer.initial_value, buffer.final_value}) {
      if (const char* layout = UnsavableLayout(t)) {
        return refuse(absl::StrCat("buffer '", address, "'"), layout);
      }
    }
  }
  return absl::OkStatus();
}

// Writes each field of NOTE [One Op field table] as the IValue Python reads back.
struct OpWriter {
  Dict& d;

  void operator()(const char* name, const std::string& v, OpField) { d.insert(name, v); }
  void operator()(const char* name, int v, OpField) { d.insert(name, static_cast<int64_t>(v)); }
  void operator()(const char* name, int64_t v, OpField) { d.insert(name, v); }
  void operator()(const char* name, bool v, OpField) { d.insert(name, v); }
  void operator()(const char* name, const std::vector<std::string>& v, OpField) {
    d.insert(name, Strings(v));
  }
  void operator()(const char* name, const absl::InlinedVector<std::string, 2>& v, OpField) {
    d.insert(name, Strings(v));
  }
  void operator()(const char* name, const at::DimVector& v, OpField) { d.insert(name, Ints(v)); }
  void operator()(const char* name, const std::optional<WriteKind>& v, OpField) {
    d.insert(name, v ? c10::IValue(std::string(WriteKindName(*v))) : c10::IValue());
  }
  void operator()(const char* name, const std::optional<bool>& v, OpField) {
    d.insert(name, v ? c10::IValue(*v) : c10::IValue());
  }
  void operator()(const char* name, const at::Tensor& v, OpField) {
    d.insert(name, TensorOrNone(v));
  }
  void operator()(const char* name, const SharedVector<at::Tensor>& v, OpField) {
    List list = NewList();
    for (const at::Tensor& t : v) list.push_back(TensorOrNone(t));
    d.insert(name, list);
  }
  void operator()(const char* name, const std::vector<at::Tensor>& v, OpField) {
    List list = NewList();
    for (const at::Tensor& t : v) list.push_back(TensorOrNone(t));
    d.insert(name, list);
  }
  // Arguments Python could not read back are left out whole; "<name>_complete" says which.
  void operator()(const char* name, const SharedVector<c10::IValue>& v, OpField) {
    bool complete = true;
    for (const c10::IValue& arg : v) complete = complete && Picklable(arg);
    List list = NewList();
    if (complete) {
      for (const c10::IValue& arg : v) list.push_back(arg);
    }
    d.insert(name, list);
    d.insert(absl::StrCat(name, "_complete"), complete);
  }
  void operator()(const char* name, const SharedVector<ArgSource>& v, OpField) {
    List list = NewList();
    for (const ArgSource& source : v) list.push_back(SourceToIValue(source));
    d.insert(name, list);
  }
  void operator()(const char* name, const std::vector<AliasWrite>& v, OpField) {
    List list = NewList();
    for (const AliasWrite& write : v) {
      Dict w = NewDict();
      w.insert("before", SourceToIValue(write.before));
      w.insert("written_tensor", static_cast<int64_t>(write.written_tensor));
      w.insert("aliased", GeometryToIValue(write.aliased));
      w.insert("written", GeometryToIValue(write.written));
      w.insert("value", TensorOrNone(write.value));
      list.push_back(w);
    }
    d.insert(name, list);
  }
  void operator()(const char* name, const std::shared_ptr<const SourcePosition>& v, OpField) {
    if (v == nullptr) {
      d.insert(name, c10::IValue());
      return;
    }
    Dict position = NewDict();
    position.insert("file", v->file);
    position.insert("line", static_cast<int64_t>(v->line));
    position.insert("column", static_cast<int64_t>(v->column));
    position.insert("text", v->text);
    List branches = NewList();
    for (const BranchTaken& branch : v->branches) {
      Dict b = NewDict();
      b.insert("file", branch.file);
      b.insert("line", static_cast<int64_t>(branch.line));
      b.insert("text", branch.text);
      b.insert("taken", std::string(branch.then ? "then" : "else"));
      branches.push_back(b);
    }
    position.insert("branches", branches);
    d.insert(name, position);
  }
};

c10::IValue OpToIValue(const Op& op) {
  Dict d = NewDict();
  VisitOpFields(op, OpWriter{d});
  return d;
}

}  // namespace

absl::StatusOr<c10::IValue> TraceFileValue(const Trace& trace) {
  if (absl::Status savable = CheckSavable(trace); !savable.ok()) return savable;
  Dict root = NewDict();
  root.insert("format", std::string(kTraceFileFormat));
  root.insert("version", static_cast<int64_t>(kTraceFileVersion));
  root.insert("training", trace.training());
  root.insert("has_saved_values", trace.has_saved_values());
  root.insert("partial_reason", trace.partial_reason());
  List ops = NewList();
  for (const Op& op : trace.ops()) ops.push_back(OpToIValue(op));
  root.insert("ops", ops);
  // NOTE [Gradients in a trace] (graph/gradients.h): what the latest backward left.
  root.insert("records_gradients", trace.records_gradients());
  List backward_ops = NewList();
  for (const Op* op : trace.backward_ops()) backward_ops.push_back(OpToIValue(*op));
  root.insert("backward_ops", backward_ops);
  c10::Dict<std::string, at::Tensor> param_grads;
  for (const auto& [address, grad] : trace.param_grads()) param_grads.insert(address, grad);
  root.insert("param_grads", param_grads);
  List buffers = NewList();
  for (const auto& [address, buffer] : trace.buffers()) {
    Dict d = NewDict();
    d.insert("address", address);
    d.insert("module_address", buffer.module_address);
    d.insert("initial_value", TensorOrNone(buffer.initial_value));
    d.insert("final_value", TensorOrNone(buffer.final_value));
    d.insert("same_tensor_as", Strings(buffer.same_tensor_as));
    d.insert("shares_storage_with", Strings(buffer.shares_storage_with));
    // See NOTE [The buffer entity in trace files].
    const BufferSummary summary = SummarizeBuffer(buffer);
    d.insert("versions", Strings(summary.versions));
    d.insert("num_overwrites", static_cast<int64_t>(buffer.num_overwrites));
    d.insert("write_kinds", Strings(summary.write_kinds));
    buffers.push_back(d);
  }
  root.insert("buffers", buffers);
  List modules = NewList();
  for (const auto& [address, module] : trace.modules()) {
    Dict d = NewDict();
    d.insert("address", address);
    d.insert("type_name", module.type_name);
    d.insert("buffers", Strings(module.buffers));
    d.insert("params", Strings(module.params));
    modules.push_back(d);
  }
  root.insert("modules", modules);
  List params = NewList();
  for (const auto& [address, param] : trace.params()) {
    Dict d = NewDict();
    d.insert("address", address);
    d.insert("shape", Ints(param.shape));
    d.insert("module_address", param.module_address);
    params.push_back(d);
  }
  root.insert("params", params);
  List diagnostics = NewList();
  for (const TraceDiagnostic& diagnostic : trace.diagnostics()) {
    Dict d = NewDict();
    d.insert("address", diagnostic.address);
    d.insert("message", diagnostic.message);
    d.insert("label", diagnostic.label);
    diagnostics.push_back(d);
  }
  root.insert("diagnostics", diagnostics);
  const CaptureStats& s = trace.capture_stats();
  Dict stats = NewDict();
  stats.insert("user_ops", s.user_ops);
  stats.insert("nested_ops", s.nested_ops);
  stats.insert("buffer_slot_reads", s.buffer_slot_reads);
  stats.insert("copy_on_write_clones", s.copy_on_write_clones);
  stats.insert("marked_sites", s.marked_sites);
  stats.insert("interpreter_sites", s.interpreter_sites);
  root.insert("capture_stats", stats);
  return root;
}

absl::Status SaveTrace(const Trace& trace, const std::string& path) {
  absl::StatusOr<c10::IValue> root = TraceFileValue(trace);
  if (!root.ok()) return root.status();
  std::vector<char> bytes;
  try {
    // See NOTE [One dtype per storage].
    if (std::optional<c10::IValue> separated = OneDtypePerStorage().Separate(*root)) {
      *root = *std::move(separated);
    }
    bytes = torch::jit::pickle_save(*root);
  } catch (const std::exception& e) {
    const std::string what = e.what();
    return absl::InternalError(
        absl::StrCat("cannot serialize the trace: ", what.substr(0, what.find('\n'))));
  }
  return WriteFileBytes(path, absl::string_view(bytes.data(), bytes.size()), "trace file");
}

}  // namespace torchlens
