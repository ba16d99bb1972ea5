// The reading half of graph/trace_file.h: LoadTrace and ParseTraceFile. Every field is read
// with its type checked (Reader), then graph/trace_file_checks.h refuses what contradicts
// itself, since a trace file is untrusted input.

#include <ATen/core/Dict.h>
#include <ATen/core/List.h>

#include <climits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "graph/file_io.h"
#include "graph/op_fields.h"
#include "graph/torch_load.h"
#include "graph/trace_file.h"
#include "graph/trace_file_checks.h"
#include "graph/zip_archive.h"

namespace torchlens {
namespace {

using Dict = c10::impl::GenericDict;

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

// Each buffer dict; `listed` gets what a file of the buffer entity lists, to be checked
// against the ops once assembled (NOTE [The buffer entity in trace files]).
void ReadBuffers(Reader& r, const Dict& root, TraceParts* parts,
                 std::map<std::string, ListedBuffer>* listed) {
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
    if (d.contains("versions")) {
      ListedBuffer& entry = (*listed)[buffer.address];
      entry.summary.versions = b.Strings(d, "versions");
      entry.summary.write_kinds = b.Strings(d, "write_kinds");
      entry.num_overwrites = b.Int(d, "num_overwrites");
    }
    parts->buffers[buffer.address] = std::move(buffer);
  }
}

void ReadModulesAndParams(Reader& r, const Dict& root, TraceParts* parts) {
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
  parts->modules = std::move(modules);
  parts->params = std::move(params);
}

void ReadDiagnostics(Reader& r, const Dict& root, TraceParts* parts) {
  for (const c10::IValue& v : r.ListOf(root, "diagnostics")) {
    Reader g("a diagnostic");
    const Dict d = g.DictAt(v);
    parts->diagnostics.push_back(
        TraceDiagnostic{g.String(d, "address"), g.String(d, "message"),
                        d.contains("label") ? g.String(d, "label") : std::string()});
  }
}

void ReadCaptureStats(Reader& r, const Dict& root, TraceParts* parts) {
  Reader s("capture_stats");
  const Dict stats = s.DictAt(r.Field(root, "capture_stats"));
  parts->stats.user_ops = s.Int(stats, "user_ops");
  parts->stats.nested_ops = s.Int(stats, "nested_ops");
  parts->stats.buffer_slot_reads = s.Int(stats, "buffer_slot_reads");
  parts->stats.copy_on_write_clones = s.Int(stats, "copy_on_write_clones");
  parts->stats.marked_sites = s.Int(stats, "marked_sites");
  parts->stats.interpreter_sites = s.Int(stats, "interpreter_sites");
}

// The trace a pickled file value describes; throws Reader::Malformed (or LibTorch's own
// errors) for a field of the wrong type.
absl::StatusOr<Trace> TraceFromIValue(const c10::IValue& value) {
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
  std::map<std::string, ListedBuffer> listed;
  ReadBuffers(r, root, &parts, &listed);
  ReadModulesAndParams(r, root, &parts);
  ReadDiagnostics(r, root, &parts);
  ReadCaptureStats(r, root, &parts);
  if (absl::Status consistent = CheckConsistent(parts.ops); !consistent.ok()) return consistent;
  if (absl::Status consistent = CheckGradients(parts); !consistent.ok()) return consistent;
  if (absl::Status modules = CheckModuleAddresses(parts); !modules.ok()) return modules;
  Trace trace = Trace::Assemble(std::move(parts));
  if (absl::Status buffers = CheckListedBuffers(trace, listed); !buffers.ok()) return buffers;
  return trace;
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
    return TraceFromIValue(value);
  } catch (const Reader::Malformed& malformed) {
    return absl::InvalidArgumentError(absl::StrCat("malformed trace file: ", malformed.message));
  } catch (const std::exception& e) {
    const std::string what = e.what();
    return absl::InvalidArgumentError(
        absl::StrCat("malformed trace file: ", what.substr(0, what.find('\n'))));
  }
}

}  // namespace

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
