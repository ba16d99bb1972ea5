#include "graph/json_export.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "graph/file_io.h"
#include "graph/gradient_norms.h"
#include "graph/op_fields.h"

namespace torchlens {
namespace {

using Json = nlohmann::ordered_json;

Json Source(const ArgSource& source) {
  return {{"kind", std::string(ArgSourceKindName(source.kind))},
          {"name", source.name},
          {"output_index", source.output_index}};
}

Json Geometry(const TensorGeometry& geometry) {
  return {{"sizes", geometry.sizes},
          {"strides", geometry.strides},
          {"storage_offset", geometry.storage_offset}};
}

// Writes each metadata field of NOTE [One Op field table]; saved values stay in trace
// files.
struct OpJsonWriter {
  Json& node;

  template <typename Member>
  void operator()(const char* name, const Member& member, OpField field) {
    if (!field.saved_value) node[name] = Value(member);
  }

  template <typename Plain>
  static Json Value(const Plain& v) {
    return Json(v);
  }
  static Json Value(const absl::InlinedVector<std::string, 2>& v) {
    return Json(std::vector<std::string>(v.begin(), v.end()));
  }
  static Json Value(const at::DimVector& v) { return Json(c10::IntArrayRef(v).vec()); }
  static Json Value(const std::optional<WriteKind>& v) {
    return v ? Json(std::string(WriteKindName(*v))) : Json(nullptr);
  }
  static Json Value(const std::optional<bool>& v) { return v ? Json(*v) : Json(nullptr); }
  static Json Value(const SharedVector<ArgSource>& v) {
    Json sources = Json::array();
    for (const ArgSource& source : v) sources.push_back(Source(source));
    return sources;
  }
  static Json Value(const std::vector<AliasWrite>& v) {
    Json writes = Json::array();
    for (const AliasWrite& write : v) {
      writes.push_back({{"before", Source(write.before)},
                        {"written_tensor", write.written_tensor},
                        {"aliased", Geometry(write.aliased)},
                        {"written", Geometry(write.written)}});
    }
    return writes;
  }
  static Json Value(const std::shared_ptr<const SourcePosition>& v) {
    if (v == nullptr) return Json(nullptr);
    Json branches = Json::array();
    for (const BranchTaken& branch : v->branches) {
      branches.push_back({{"file", branch.file},
                          {"line", branch.line},
                          {"text", branch.text},
                          {"taken", branch.then ? "then" : "else"}});
    }
    return {{"file", v->file},
            {"line", v->line},
            {"column", v->column},
            {"text", v->text},
            {"branches", std::move(branches)}};
  }
  // Saved values never reach `Value` (see operator()); these keep the template from
  // being instantiated for them.
  static Json Value(const at::Tensor&) { return Json(nullptr); }
  static Json Value(const SharedVector<at::Tensor>&) { return Json(nullptr); }
  static Json Value(const std::vector<at::Tensor>&) { return Json(nullptr); }
  static Json Value(const SharedVector<c10::IValue>&) { return Json(nullptr); }
};

Json NormOrNull(const at::Tensor& grad) {
  const std::optional<double> norm = GradNorm(grad);
  return norm.has_value() ? Json(*norm) : Json(nullptr);
}

}  // namespace

absl::StatusOr<std::string> TraceToJson(const Trace& trace, const JsonMembers& extra) {
  Json root;
  root["schema"] = kJsonSchema;
  root["version"] = kJsonSchemaVersion;
  root["training"] = trace.training();
  root["has_saved_values"] = trace.has_saved_values();
  root["partial_reason"] = trace.partial_reason();
  Json& ops = root["ops"] = Json::array();
  for (const Op& op : trace.ops()) {
    Json node;
    VisitOpFields(op, OpJsonWriter{node});
    node["grad_norm"] = NormOrNull(op.grad);
    ops.push_back(std::move(node));
  }
  // NOTE [Gradients in a trace] in graph/gradients.h.
  root["records_gradients"] = trace.records_gradients();
  Json& backward_ops = root["backward_ops"] = Json::array();
  for (const Op* op : trace.backward_ops()) {
    Json node;
    VisitOpFields(*op, OpJsonWriter{node});
    node["grad_norm"] = NormOrNull(op->grad);
    backward_ops.push_back(std::move(node));
  }
  Json& param_grad_norms = root["param_grad_norms"] = Json::object();
  for (const auto& [address, grad] : trace.param_grads()) {
    param_grad_norms[address] = NormOrNull(grad);
  }
  Json& buffers = root["buffers"] = Json::array();
  for (const auto& [address, buffer] : trace.buffers()) {
    Json entry;
    entry["address"] = address;
    entry["module_address"] = buffer.module_address;
    Json& versions = entry["versions"] = Json::array();
    Json write_kinds = Json::array();
    for (const Op* version : buffer.versions) {
      versions.push_back(version->label);
      if (version->buffer_write_kind.has_value()) {
        write_kinds.push_back(std::string(WriteKindName(*version->buffer_write_kind)));
      }
    }
    entry["num_overwrites"] = buffer.num_overwrites;
    entry["write_kinds"] = std::move(write_kinds);
    entry["same_tensor_as"] = buffer.same_tensor_as;
    entry["shares_storage_with"] = buffer.shares_storage_with;
    entry["shape"] =
        buffer.initial_value.defined() ? Json(buffer.initial_value.sizes().vec()) : Json::array();
    entry["dtype"] =
        buffer.initial_value.defined() ? c10::toString(buffer.initial_value.scalar_type()) : "";
    buffers.push_back(std::move(entry));
  }
  Json& modules = root["modules"] = Json::array();
  const std::map<std::string, double> module_norms = ModuleGradNorms(trace);
  for (const auto& [address, module] : trace.modules()) {
    auto norm = module_norms.find(address);
    modules.push_back(
        {{"address", address},
         {"type_name", module.type_name},
         {"buffers", module.buffers},
         {"params", module.params},
         {"grad_norm", norm == module_norms.end() ? Json(nullptr) : Json(norm->second)}});
  }
  Json& params = root["params"] = Json::array();
  for (const auto& [address, param] : trace.params()) {
    params.push_back(
        {{"address", address}, {"shape", param.shape}, {"module_address", param.module_address}});
  }
  Json& diagnostics = root["diagnostics"] = Json::array();
  for (const TraceDiagnostic& diagnostic : trace.diagnostics()) {
    diagnostics.push_back({{"address", diagnostic.address},
                           {"message", diagnostic.message},
                           {"label", diagnostic.label}});
  }
  const CaptureStats& stats = trace.capture_stats();
  root["capture_stats"] = {{"user_ops", stats.user_ops},
                           {"nested_ops", stats.nested_ops},
                           {"buffer_slot_reads", stats.buffer_slot_reads},
                           {"copy_on_write_clones", stats.copy_on_write_clones},
                           {"marked_sites", stats.marked_sites},
                           {"interpreter_sites", stats.interpreter_sites}};
  for (const auto& [name, document] : extra) {
    Json member = Json::parse(document, nullptr, /*allow_exceptions=*/false);
    if (member.is_discarded()) {
      return absl::InvalidArgumentError(
          absl::StrCat("JSON member \"", name, "\" is not a valid JSON document"));
    }
    root[name] = std::move(member);
  }
  // Labels and addresses read from a file may not be UTF-8: replaced (U+FFFD), never
  // thrown, so that the other outputs are still written.
  return root.dump(2, ' ', false, Json::error_handler_t::replace);
}

absl::Status WriteJson(const Trace& trace, const std::string& path, const JsonMembers& extra) {
  absl::StatusOr<std::string> json = TraceToJson(trace, extra);
  if (!json.ok()) return json.status();
  return WriteFileBytes(path, absl::StrCat(*json, "\n"), "JSON file");
}

}  // namespace torchlens
