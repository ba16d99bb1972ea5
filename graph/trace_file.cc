#include "graph/trace_file.h"

#include <ATen/core/Dict.h>
#include <ATen/core/List.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/types/span.h"
#include "graph/file_io.h"
#include "graph/op_fields.h"
#include "graph/torch_load.h"
#include "graph/zip_archive.h"

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

// NOTE [The buffer entity in trace files]
// Each buffer of a trace file carries TorchLens's names for its state: `versions` (the
// labels of its version nodes, the initial read first), `num_overwrites` and `write_kinds`
// (one per write, in order: "inplace", "reassign", "fused"), so that Python reads a
// buffer's history without rebuilding it from the ops. The reader rebuilds them from the
// ops all the same, as it always did, and refuses a file whose lists say otherwise; files
// written before the lists existed load as before.
struct BufferSummary {
  std::vector<std::string> versions;
  std::vector<std::string> write_kinds;
};
BufferSummary SummarizeBuffer(const Buffer& buffer) {
  BufferSummary summary;
  for (const Op* version : buffer.versions) {
    summary.versions.push_back(version->label);
    if (version->buffer_write_kind.has_value()) {
      summary.write_kinds.emplace_back(WriteKindName(*version->buffer_write_kind));
    }
  }
  return summary;
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

// Typed access that turns every mismatch into an error naming the place.
class Reader {
 public:
  explicit Reader(std::string where) : where_(std::move(where)) {}

  const c10::IValue& Field(const Dict& d, const char* key) {
    auto it = d.find(key);
    if (it == d.end()) throw Malformed{absl::StrCat(where_, " has no \"", key, "\"")};
    return it->value();
  }
  std::string String(const Dict& d, const char* key) {
    const c10::IValue& v = Field(d, key);
    if (!v.isString()) throw Malformed{absl::StrCat(where_, " \"", key, "\" is not a string")};
    return v.toStringRef();
  }
  int64_t Int(const Dict& d, const char* key) {
    const c10::IValue& v = Field(d, key);
    if (!v.isInt()) throw Malformed{absl::StrCat(where_, " \"", key, "\" is not an int")};
    return v.toInt();
  }
  // An int field held as `int`: one outside its range is malformed, not truncated (an
  // output index of 2^32 + 1 read as output 1).
  int Int32(const Dict& d, const char* key) {
    const int64_t v = Int(d, key);
    if (v < INT_MIN || v > INT_MAX) {
      throw Malformed{absl::StrCat(where_, " \"", key, "\" is ", v, ", outside the range of int")};
    }
    return static_cast<int>(v);
  }
  bool Bool(const Dict& d, const char* key) {
    const c10::IValue& v = Field(d, key);
    if (!v.isBool()) throw Malformed{absl::StrCat(where_, " \"", key, "\" is not a bool")};
    return v.toBool();
  }
  at::Tensor Tensor(const Dict& d, const char* key) {
    const c10::IValue& v = Field(d, key);
    if (v.isNone()) return at::Tensor();
    if (!v.isTensor()) throw Malformed{absl::StrCat(where_, " \"", key, "\" is not a tensor")};
    return v.toTensor();
  }
  std::vector<std::string> Strings(const Dict& d, const char* key) {
    std::vector<std::string> out;
    for (const c10::IValue& v : ListOf(d, key)) {
      if (!v.isString()) throw Malformed{absl::StrCat(where_, " \"", key, "\" holds a non-string")};
      out.push_back(v.toStringRef());
    }
    return out;
  }
  std::vector<int64_t> Ints(const Dict& d, const char* key) {
    std::vector<int64_t> out;
    for (const c10::IValue& v : ListOf(d, key)) {
      if (!v.isInt()) throw Malformed{absl::StrCat(where_, " \"", key, "\" holds a non-int")};
      out.push_back(v.toInt());
    }
    return out;
  }
  c10::ArrayRef<c10::IValue> ListOf(const Dict& d, const char* key) {
    const c10::IValue& v = Field(d, key);
    if (!v.isList()) throw Malformed{absl::StrCat(where_, " \"", key, "\" is not a list")};
    return v.toListRef();
  }
  Dict DictAt(const c10::IValue& v) {
    if (!v.isGenericDict()) throw Malformed{absl::StrCat(where_, " is not a dict")};
    return v.toGenericDict();
  }

  struct Malformed {
    std::string message;
  };

 private:
  std::string where_;
};

ArgSource SourceFromIValue(const c10::IValue& source, size_t index) {
  if (!source.isTuple() || source.toTupleRef().elements().size() != 3) {
    throw Reader::Malformed{absl::StrCat("ops[", index, "] has a malformed arg source")};
  }
  const auto& e = source.toTupleRef().elements();
  if (!e[0].isString() || !e[1].isString() || !e[2].isInt()) {
    throw Reader::Malformed{absl::StrCat("ops[", index, "] has a malformed arg source")};
  }
  ArgSource arg;
  const std::string& kind_name = e[0].toStringRef();
  for (ArgSource::Kind k : {ArgSource::Kind::kNode, ArgSource::Kind::kParam,
                            ArgSource::Kind::kConstant, ArgSource::Kind::kNone}) {
    if (kind_name == ArgSourceKindName(k)) arg.kind = k;
  }
  arg.name = e[1].toStringRef();
  if (e[2].toInt() < INT_MIN || e[2].toInt() > INT_MAX) {
    throw Reader::Malformed{
        absl::StrCat("ops[", index, "] has an arg source output index outside the range of int")};
  }
  arg.output_index = static_cast<int>(e[2].toInt());
  return arg;
}

TensorGeometry GeometryFromIValue(Reader& r, const c10::IValue& value) {
  const Dict d = r.DictAt(value);
  TensorGeometry geometry;
  geometry.sizes = r.Ints(d, "sizes");
  geometry.strides = r.Ints(d, "strides");
  geometry.storage_offset = r.Int(d, "storage_offset");
  return geometry;
}

// Reads each field of NOTE [One Op field table] back, checking its type.
struct OpReader {
  Reader& r;
  const Dict& d;
  int64_t version;
  size_t index;

  template <typename Member>
  void operator()(const char* name, Member& member, OpField field) {
    if (field.since_version <= version) Read(name, member);
  }

  void Read(const char* name, std::string& v) { v = r.String(d, name); }
  void Read(const char* name, int& v) { v = r.Int32(d, name); }
  void Read(const char* name, int64_t& v) { v = r.Int(d, name); }
  void Read(const char* name, bool& v) { v = r.Bool(d, name); }
  void Read(const char* name, std::vector<std::string>& v) { v = r.Strings(d, name); }
  void Read(const char* name, absl::InlinedVector<std::string, 2>& v) {
    std::vector<std::string> strings = r.Strings(d, name);
    v.assign(std::make_move_iterator(strings.begin()), std::make_move_iterator(strings.end()));
  }
  void Read(const char* name, at::DimVector& v) {
    const std::vector<int64_t> ints = r.Ints(d, name);
    v.assign(ints.begin(), ints.end());
  }
  void Read(const char* name, std::optional<WriteKind>& v) {
    const c10::IValue& field = r.Field(d, name);
    if (!field.isString()) return;
    for (WriteKind k : {WriteKind::kReassign, WriteKind::kInplace, WriteKind::kFused}) {
      if (WriteKindName(k) == field.toStringRef()) v = k;
    }
    if (!v) {
      throw Reader::Malformed{
          absl::StrCat("ops[", index, "] has ", name, " \"", field.toStringRef(), "\"")};
    }
  }
  void Read(const char* name, std::optional<bool>& v) {
    const c10::IValue& field = r.Field(d, name);
    if (field.isBool()) v = field.toBool();
  }
  void Read(const char* name, at::Tensor& v) { v = r.Tensor(d, name); }
  void Read(const char* name, SharedVector<at::Tensor>& v) {
    const auto& values = r.ListOf(d, name);
    v.reserve(values.size());
    for (const c10::IValue& t : values) {
      if (!t.isNone() && !t.isTensor()) {
        throw Reader::Malformed{absl::StrCat("ops[", index, "] \"", name, "\" holds a non-tensor")};
      }
      v.push_back(t.isTensor() ? t.toTensor() : at::Tensor());
    }
  }
  void Read(const char* name, std::vector<at::Tensor>& v) {
    for (const c10::IValue& t : r.ListOf(d, name)) {
      if (!t.isNone() && !t.isTensor()) {
        throw Reader::Malformed{absl::StrCat("ops[", index, "] \"", name, "\" holds a non-tensor")};
      }
      v.push_back(t.isTensor() ? t.toTensor() : at::Tensor());
    }
  }
  void Read(const char* name, SharedVector<c10::IValue>& v) {
    if (!r.Bool(d, absl::StrCat(name, "_complete").c_str())) return;
    const auto& values = r.ListOf(d, name);
    v.reserve(values.size());
    for (const c10::IValue& arg : values) v.push_back(arg);
  }
  void Read(const char* name, SharedVector<ArgSource>& v) {
    const auto& sources = r.ListOf(d, name);
    v.reserve(sources.size());
    for (const c10::IValue& source : sources) v.push_back(SourceFromIValue(source, index));
  }
  void Read(const char* name, std::vector<AliasWrite>& v) {
    for (const c10::IValue& value : r.ListOf(d, name)) {
      Reader w(absl::StrCat("ops[", index, "] alias write"));
      const Dict write = w.DictAt(value);
      AliasWrite alias;
      alias.before = SourceFromIValue(w.Field(write, "before"), index);
      alias.written_tensor = w.Int32(write, "written_tensor");
      alias.aliased = GeometryFromIValue(w, w.Field(write, "aliased"));
      alias.written = GeometryFromIValue(w, w.Field(write, "written"));
      alias.value = w.Tensor(write, "value");
      v.push_back(std::move(alias));
    }
  }
  void Read(const char* name, std::shared_ptr<const SourcePosition>& v) {
    const c10::IValue& field = r.Field(d, name);
    if (field.isNone()) return;
    Reader p(absl::StrCat("ops[", index, "] source position"));
    const Dict d = p.DictAt(field);
    auto position = std::make_shared<SourcePosition>();
    position->file = p.String(d, "file");
    position->line = p.Int32(d, "line");
    position->column = p.Int32(d, "column");
    position->text = p.String(d, "text");
    for (const c10::IValue& value : p.ListOf(d, "branches")) {
      Reader b(absl::StrCat("ops[", index, "] source position branch"));
      const Dict branch = b.DictAt(value);
      BranchTaken taken;
      taken.file = b.String(branch, "file");
      taken.line = b.Int32(branch, "line");
      taken.text = b.String(branch, "text");
      const std::string which = b.String(branch, "taken");
      if (which != "then" && which != "else") {
        throw Reader::Malformed{
            absl::StrCat("ops[", index, "] has a branch taken \"", which, "\"")};
      }
      taken.then = which == "then";
      position->branches.push_back(std::move(taken));
    }
    v = std::move(position);
  }
};

Op OpFromIValue(const c10::IValue& value, int64_t version, size_t index) {
  Reader r(absl::StrCat("ops[", index, "]"));
  const Dict d = r.DictAt(value);
  Op op;
  VisitOpFields(op, OpReader{r, d, version, index});
  op.kind = OpKindOf(op.type, op.is_buffer);
  return op;
}

// The parts of a file that must agree with each other, so that a crafted file cannot make
// the summary, validation or replay present what it does not hold: labels are unique (the
// edges name them), every parent is an earlier op (NOTE [Node order] in build_trace.cc),
// and an op's recorded shape and dtype are its saved value's.
absl::Status CheckConsistent(const std::vector<Op>& ops) {
  absl::flat_hash_map<absl::string_view, size_t> index;
  index.reserve(ops.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    for (const std::string& parent : op.parents) {
      auto it = index.find(parent);
      if (it == index.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "malformed trace file: op \"", absl::CHexEscape(op.label), "\" (op ", i,
            ") lists parent \"", absl::CHexEscape(parent),
            "\", which is not an op before it; ops are in execution order and parents run "
            "first"));
      }
    }
    int64_t end_ns = 0;
    if (op.start_ns < -1 || op.duration_ns < -1 ||
        (op.duration_ns >= 0 && __builtin_add_overflow(op.start_ns, op.duration_ns, &end_ns))) {
      return absl::InvalidArgumentError(
          absl::StrCat("malformed trace file: op \"", absl::CHexEscape(op.label),
                       "\" records start ", op.start_ns, " ns and duration ", op.duration_ns,
                       " ns; times are -1 (not timed) or nanoseconds from the first op"));
    }
    if (!index.emplace(op.label, i).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "malformed trace file: label \"", absl::CHexEscape(op.label), "\" appears twice"));
    }
    if (!op.out.defined()) continue;
    if (c10::IntArrayRef(op.tensor_shape) != op.out.sizes() ||
        op.tensor_dtype != c10::toString(op.out.scalar_type())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "malformed trace file: op \"", absl::CHexEscape(op.label), "\" records shape [",
          absl::StrJoin(op.tensor_shape, ", "), "] and dtype \"", absl::CHexEscape(op.tensor_dtype),
          "\", but its saved value has shape [", absl::StrJoin(op.out.sizes(), ", "),
          "] and dtype ", c10::toString(op.out.scalar_type())));
    }
  }
  return absl::OkStatus();
}

// Version 4's gradients: whether the trace records them, the backward ops (op dicts of the
// same table), and the parameters' gradients by address.
void ReadGradients(Reader& r, const Dict& root, int64_t version, TraceParts* parts) {
  parts->records_gradients = r.Bool(root, "records_gradients");
  const c10::ArrayRef<c10::IValue> backward = r.ListOf(root, "backward_ops");
  for (size_t i = 0; i < backward.size(); ++i) {
    Op op = OpFromIValue(backward[i], version, i);
    op.kind = OpKind::kBackward;
    parts->backward_ops.push_back(std::move(op));
  }
  const c10::IValue& grads = r.Field(root, "param_grads");
  if (!grads.isGenericDict()) throw Reader::Malformed{"\"param_grads\" is not a dict"};
  for (const auto& entry : grads.toGenericDict()) {
    if (!entry.key().isString() || !entry.value().isTensor()) {
      throw Reader::Malformed{"\"param_grads\" maps something else than addresses to tensors"};
    }
    parts->param_grads[entry.key().toStringRef()] = entry.value().toTensor();
  }
}

// Gradients that contradict the ops: a gradient of another shape than its value, a backward
// op linked to a node the trace does not have, or edges to backward ops it does not list.
absl::Status CheckGradients(const TraceParts& parts) {
  absl::flat_hash_map<absl::string_view, size_t> forward;
  for (size_t i = 0; i < parts.ops.size(); ++i) {
    const Op& op = parts.ops[i];
    forward.emplace(op.label, i);
    if (op.grad.defined() && op.grad.sizes() != c10::IntArrayRef(op.tensor_shape)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "malformed trace file: op \"", absl::CHexEscape(op.label), "\" records shape [",
          absl::StrJoin(op.tensor_shape, ", "), "] but its gradient has shape [",
          absl::StrJoin(op.grad.sizes(), ", "), "]"));
    }
  }
  absl::flat_hash_map<absl::string_view, size_t> backward;
  for (size_t i = 0; i < parts.backward_ops.size(); ++i) {
    const Op& op = parts.backward_ops[i];
    if (!backward.emplace(op.label, i).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "malformed trace file: backward op \"", absl::CHexEscape(op.label), "\" appears twice"));
    }
    if (!op.forward_label.empty() && !forward.contains(op.forward_label)) {
      return absl::InvalidArgumentError(
          absl::StrCat("malformed trace file: backward op \"", absl::CHexEscape(op.label),
                       "\" differentiates \"", absl::CHexEscape(op.forward_label),
                       "\", which is not a node of the trace"));
    }
  }
  for (const Op& op : parts.backward_ops) {
    for (const std::vector<std::string>* edges : {&op.parents, &op.children}) {
      for (const std::string& label : *edges) {
        if (backward.contains(label)) continue;
        return absl::InvalidArgumentError(
            absl::StrCat("malformed trace file: backward op \"", absl::CHexEscape(op.label),
                         "\" is linked to \"", absl::CHexEscape(label),
                         "\", which is not a backward op of the trace"));
      }
    }
  }
  return absl::OkStatus();
}

// Module addresses name modules as capture writes them ("layer1.0.conv1"): dot-separated
// names, none empty. Their nesting bounds the recursion of the pictures' clusters and the
// size of the per-module listings (a crafted address of 200,000 levels made the summary's
// module totals quadratic); the depth bench's 1,000-level model is the deepest we build.
constexpr size_t kMaxModuleAddressBytes = 64 << 10;
constexpr size_t kMaxModuleDepth = 2048;
absl::Status CheckModuleAddress(absl::string_view address, absl::string_view where) {
  if (address.empty()) return absl::OkStatus();  // the model itself
  size_t depth = 1, component = 0;
  for (const char c : address) {
    if (c != '.') {
      ++component;
      continue;
    }
    if (component == 0) break;
    component = 0;
    ++depth;
  }
  if (component == 0 || address.size() > kMaxModuleAddressBytes || depth > kMaxModuleDepth) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed trace file: ", where, " has the module address \"",
                     absl::CHexEscape(address.substr(0, 200)), address.size() > 200 ? "..." : "",
                     "\" (", address.size(),
                     " bytes); a module address is module names joined by single dots, at "
                     "most ",
                     kMaxModuleDepth, " levels and ", kMaxModuleAddressBytes, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status CheckModuleAddresses(const TraceParts& parts) {
  for (const Op& op : parts.ops) {
    if (absl::Status s = CheckModuleAddress(
            op.module_address, absl::StrCat("op \"", absl::CHexEscape(op.label), "\""));
        !s.ok()) {
      return s;
    }
  }
  for (const auto& [address, module] : *parts.modules) {
    if (absl::Status s = CheckModuleAddress(address, "a module"); !s.ok()) return s;
  }
  for (const auto& [address, param] : *parts.params) {
    if (absl::Status s = CheckModuleAddress(param.module_address, "a param"); !s.ok()) return s;
  }
  for (const auto& [address, buffer] : parts.buffers) {
    if (absl::Status s = CheckModuleAddress(buffer.module_address, "a buffer"); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// `owner`, when not null, keeps `bytes` mapped: tensors are made over them in place.
absl::StatusOr<Trace> ParseTrace(absl::string_view bytes, std::shared_ptr<void> owner) {
  absl::StatusOr<c10::IValue> loaded = LoadPickledInPlace(bytes, std::move(owner));
  if (!loaded.ok()) {
    // A model archive (torch.jit.save) holds its code and constants beside its pickle.
    if (absl::StatusOr<ZipArchive> zip = ZipArchive::Open(bytes);
        zip.ok() && zip->Find("constants.pkl") != nullptr) {
      return absl::InvalidArgumentError(
          "a TorchScript model archive (torch.jit.save), not a trace file: load it as a model "
          "(torch::jit::load; the command-line tool's --model)");
    }
    return absl::InvalidArgumentError(
        absl::StrCat("not a readable trace file: ", loaded.status().message()));
  }
  const c10::IValue value = *std::move(loaded);
  try {
    Reader r("the trace file");
    const Dict root = r.DictAt(value);
    if (r.String(root, "format") != kTraceFileFormat) {
      return absl::InvalidArgumentError(
          absl::StrCat("not a torchlens trace file (format \"", r.String(root, "format"), "\")"));
    }
    const int64_t version = r.Int(root, "version");
    if (version < 1 || version > kTraceFileVersion) {
      return absl::FailedPreconditionError(
          absl::StrCat("trace file version ", version, "; this torchlens reads versions 1 to ",
                       kTraceFileVersion, " (write it again with this torchlens)"));
    }
    TraceParts parts;
    parts.training = r.Bool(root, "training");
    parts.has_saved_values = r.Bool(root, "has_saved_values");
    // Absent from files of torchlens before early stop and the memory budget: complete.
    if (root.contains("partial_reason")) parts.partial_reason = r.String(root, "partial_reason");
    const c10::ArrayRef<c10::IValue> ops = r.ListOf(root, "ops");
    for (size_t i = 0; i < ops.size(); ++i) parts.ops.push_back(OpFromIValue(ops[i], version, i));
    if (version >= 4) ReadGradients(r, root, version, &parts);
    std::map<std::string, BufferSummary> listed;
    std::map<std::string, int64_t> listed_overwrites;
    for (const c10::IValue& v : r.ListOf(root, "buffers")) {
      Reader b("a buffer");
      const Dict d = b.DictAt(v);
      Buffer buffer;
      buffer.address = b.String(d, "address");
      buffer.module_address = b.String(d, "module_address");
      buffer.initial_value = b.Tensor(d, "initial_value");
      buffer.final_value = b.Tensor(d, "final_value");
      // Absent from older files: no buffers on one storage known.
      if (d.contains("same_tensor_as")) buffer.same_tensor_as = b.Strings(d, "same_tensor_as");
      if (d.contains("shares_storage_with")) {
        buffer.shares_storage_with = b.Strings(d, "shares_storage_with");
      }
      // Checked against the ops once assembled (NOTE [The buffer entity in trace files]).
      if (d.contains("versions")) {
        BufferSummary& summary = listed[buffer.address];
        summary.versions = b.Strings(d, "versions");
        summary.write_kinds = b.Strings(d, "write_kinds");
        listed_overwrites[buffer.address] = b.Int(d, "num_overwrites");
      }
      parts.buffers[buffer.address] = std::move(buffer);
    }
    auto modules = std::make_shared<std::map<std::string, Module>>();
    auto params = std::make_shared<std::map<std::string, Param>>();
    for (const c10::IValue& v : r.ListOf(root, "modules")) {
      Reader m("a module");
      const Dict d = m.DictAt(v);
      Module module{m.String(d, "address"), m.String(d, "type_name"), m.Strings(d, "buffers"),
                    m.Strings(d, "params")};
      (*modules)[module.address] = std::move(module);
    }
    for (const c10::IValue& v : r.ListOf(root, "params")) {
      Reader p("a param");
      const Dict d = p.DictAt(v);
      Param param{p.String(d, "address"), p.Ints(d, "shape"), p.String(d, "module_address")};
      int64_t numel = 1;
      for (const int64_t size : param.shape) {
        if (size < 0 || __builtin_mul_overflow(numel, size, &numel)) {
          throw Reader::Malformed{absl::StrCat("param \"", absl::CHexEscape(param.address),
                                               "\" has a shape no tensor has")};
        }
      }
      (*params)[param.address] = std::move(param);
    }
    parts.modules = std::move(modules);
    parts.params = std::move(params);
    for (const c10::IValue& v : r.ListOf(root, "diagnostics")) {
      Reader g("a diagnostic");
      const Dict d = g.DictAt(v);
      parts.diagnostics.push_back(
          TraceDiagnostic{g.String(d, "address"), g.String(d, "message"),
                          d.contains("label") ? g.String(d, "label") : std::string()});
    }
    Reader s("capture_stats");
    const Dict stats = s.DictAt(r.Field(root, "capture_stats"));
    parts.stats.user_ops = s.Int(stats, "user_ops");
    parts.stats.nested_ops = s.Int(stats, "nested_ops");
    parts.stats.buffer_slot_reads = s.Int(stats, "buffer_slot_reads");
    parts.stats.copy_on_write_clones = s.Int(stats, "copy_on_write_clones");
    parts.stats.marked_sites = s.Int(stats, "marked_sites");
    parts.stats.interpreter_sites = s.Int(stats, "interpreter_sites");
    if (absl::Status consistent = CheckConsistent(parts.ops); !consistent.ok()) return consistent;
    if (absl::Status consistent = CheckGradients(parts); !consistent.ok()) return consistent;
    if (absl::Status modules = CheckModuleAddresses(parts); !modules.ok()) return modules;
    Trace trace = Trace::Assemble(std::move(parts));
    for (const auto& [address, summary] : listed) {
      const Buffer& buffer = trace.buffers().at(address);
      const BufferSummary rebuilt = SummarizeBuffer(buffer);
      if (summary.versions != rebuilt.versions || summary.write_kinds != rebuilt.write_kinds ||
          listed_overwrites[address] != buffer.num_overwrites) {
        return absl::InvalidArgumentError(absl::StrCat(
            "malformed trace file: buffer \"", absl::CHexEscape(address), "\" lists versions [",
            absl::StrJoin(summary.versions, ", "), "] with ", listed_overwrites[address],
            " overwrites (", absl::StrJoin(summary.write_kinds, ", "), ") but its ops give [",
            absl::StrJoin(rebuilt.versions, ", "), "] with ", buffer.num_overwrites,
            " overwrites (", absl::StrJoin(rebuilt.write_kinds, ", "), ")"));
      }
    }
    return trace;
  } catch (const Reader::Malformed& malformed) {
    return absl::InvalidArgumentError(absl::StrCat("malformed trace file: ", malformed.message));
  } catch (const std::exception& e) {
    const std::string what = e.what();
    return absl::InvalidArgumentError(
        absl::StrCat("malformed trace file: ", what.substr(0, what.find('\n'))));
  }
}

// NOTE [One dtype per storage]
// LibTorch's pickler writes each storage once, typed by the dtype of the first tensor it
// meets on it. A tensor of another dtype on the same storage (`torch.view_as_real` of a
// complex op output, `view_as_complex` of a float one, `.view(dtype)`) would be read back
// through the wrong type: Python's torch.load fails or returns other values. Such a
// tensor is written as a copy with a storage of its own. The pickler also writes a
// tensor's storage, geometry and dtype but not its lazy conjugate or negative bit
// (`c.conj()` of a complex tensor is a view that reads its storage conjugated): such a
// tensor is written as a copy with the bit applied, so that it reads back as the values
// it held. The trace is not changed: a list or tuple holding such a tensor is copied,
// not written.
class OneDtypePerStorage {
 public:
  // `value` with such tensors copied, or nullopt when it holds none.
  std::optional<c10::IValue> Separate(const c10::IValue& value) {
    if (value.isTensor()) {
      const at::Tensor& t = value.toTensor();
      if (!t.defined() || !t.has_storage()) return std::nullopt;
      if (t.is_conj() || t.is_neg()) {
        at::Tensor resolved = t.resolve_conj().resolve_neg();
        dtypes_.emplace(resolved.storage().unsafeGetStorageImpl(), resolved.scalar_type());
        return c10::IValue(std::move(resolved));
      }
      auto [it, first] = dtypes_.emplace(t.storage().unsafeGetStorageImpl(), t.scalar_type());
      if (first || it->second == t.scalar_type()) return std::nullopt;
      at::Tensor copy = t.clone();
      dtypes_.emplace(copy.storage().unsafeGetStorageImpl(), copy.scalar_type());
      return c10::IValue(std::move(copy));
    }
    if (value.isList()) {
      c10::List<c10::IValue> list = value.toList();
      std::optional<c10::List<c10::IValue>> copy;
      for (size_t i = 0; i < list.size(); ++i) {
        std::optional<c10::IValue> element = Separate(list.get(i));
        if (!element.has_value()) continue;
        if (!copy.has_value()) copy = list.copy();
        copy->set(i, *std::move(element));
      }
      return copy.has_value() ? std::optional<c10::IValue>(c10::IValue(*copy)) : std::nullopt;
    }
    if (value.isTuple()) {
      const auto& elements = value.toTupleRef().elements();
      std::vector<c10::IValue> copy;
      for (size_t i = 0; i < elements.size(); ++i) {
        std::optional<c10::IValue> element = Separate(elements[i]);
        if (!element.has_value()) continue;
        if (copy.empty()) copy.assign(elements.begin(), elements.end());
        copy[i] = *std::move(element);
      }
      if (copy.empty()) return std::nullopt;
      return c10::IValue(c10::ivalue::Tuple::create(std::move(copy)));
    }
    if (value.isGenericDict()) {
      Dict dict = value.toGenericDict();
      std::optional<Dict> copy;
      for (const auto& entry : dict) {
        std::optional<c10::IValue> element = Separate(entry.value());
        if (!element.has_value()) continue;
        if (!copy.has_value()) copy = dict.copy();
        copy->insert_or_assign(entry.key(), *std::move(element));
      }
      return copy.has_value() ? std::optional<c10::IValue>(c10::IValue(*copy)) : std::nullopt;
    }
    return std::nullopt;
  }

 private:
  absl::flat_hash_map<const c10::StorageImpl*, c10::ScalarType> dtypes_;
};

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

absl::StatusOr<Trace> LoadTrace(const std::string& path) {
  ReadLimits paging;
  paging.page_on_use = true;  // values are read from disk when used
  absl::StatusOr<FileBytes> read = ReadFileBytes(
      path, {"trace file", "a trace file written by torchlens (SaveTrace or --save)"}, paging);
  if (!read.ok()) return read.status();
  auto file = std::make_shared<FileBytes>(*std::move(read));
  absl::StatusOr<Trace> trace = ParseTrace(file->view(), file);
  if (!trace.ok()) {
    return absl::Status(trace.status().code(),
                        absl::StrCat("'", path, "': ", trace.status().message()));
  }
  return trace;
}

absl::StatusOr<Trace> ParseTraceFile(const std::vector<char>& bytes) {
  // In place, as LoadTrace reads a file (NOTE [Values read on use]), over a copy the
  // trace's tensors keep alive: tests and fuzzing exercise the loader's own path.
  auto copy = std::make_shared<std::vector<char>>(bytes);
  return ParseTrace(absl::string_view(copy->data(), copy->size()), copy);
}

}  // namespace torchlens
