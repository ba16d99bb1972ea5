#include "graph/json_export.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "graph/file_io.h"

namespace torchlens {
namespace {

using Json = nlohmann::ordered_json;

Json Optional(const std::optional<bool>& value) { return value ? Json(*value) : Json(nullptr); }

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

}  // namespace

absl::StatusOr<std::string> TraceToJson(const Trace& trace, const JsonMembers& extra) {
  Json root;
  root["schema"] = kJsonSchema;
  root["version"] = kJsonSchemaVersion;
  root["training"] = trace.training();
  root["has_saved_values"] = trace.has_saved_values();
  Json& ops = root["ops"] = Json::array();
  for (const Op& op : trace.ops()) {
    Json node;
    node["label"] = op.label;
    node["type"] = op.type;
    node["func_name"] = op.func_name;
    node["overload_name"] = op.overload_name;
    node["pass"] = op.pass;
    node["layer_type_index"] = op.layer_type_index;
    node["layer_step_index"] = op.layer_step_index;
    node["module_address"] = op.module_address;
    node["parents"] = op.parents;
    node["children"] = op.children;
    node["parent_params"] =
        std::vector<std::string>(op.parent_params.begin(), op.parent_params.end());
    node["tensor_shape"] = c10::IntArrayRef(op.tensor_shape).vec();
    node["tensor_dtype"] = op.tensor_dtype;
    node["is_buffer"] = op.is_buffer;
    node["address"] = op.address;
    node["buffer_pass"] = op.buffer_pass;
    node["buffer_write_kind"] = op.buffer_write_kind
                                    ? Json(std::string(WriteKindName(*op.buffer_write_kind)))
                                    : Json(nullptr);
    node["buffer_value_changed"] = Optional(op.buffer_value_changed);
    Json& sources = node["arg_sources"] = Json::array();
    for (const ArgSource& source : op.arg_sources) sources.push_back(Source(source));
    node["start_ns"] = op.start_ns;
    node["duration_ns"] = op.duration_ns;
    Json& writes = node["alias_writes"] = Json::array();
    for (const AliasWrite& write : op.alias_writes) {
      writes.push_back({{"before", Source(write.before)},
                        {"written_tensor", write.written_tensor},
                        {"aliased", Geometry(write.aliased)},
                        {"written", Geometry(write.written)}});
    }
    ops.push_back(std::move(node));
  }
  Json& buffers = root["buffers"] = Json::array();
  for (const auto& [address, buffer] : trace.buffers()) {
    Json entry;
    entry["address"] = address;
    entry["module_address"] = buffer.module_address;
    Json& versions = entry["versions"] = Json::array();
    for (const Op* version : buffer.versions) versions.push_back(version->label);
    entry["num_overwrites"] = buffer.num_overwrites;
    entry["shape"] =
        buffer.initial_value.defined() ? Json(buffer.initial_value.sizes().vec()) : Json::array();
    entry["dtype"] =
        buffer.initial_value.defined() ? c10::toString(buffer.initial_value.scalar_type()) : "";
    buffers.push_back(std::move(entry));
  }
  Json& modules = root["modules"] = Json::array();
  for (const auto& [address, module] : trace.modules()) {
    modules.push_back({{"address", address},
                       {"type_name", module.type_name},
                       {"buffers", module.buffers},
                       {"params", module.params}});
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
  return root.dump(2);
}

absl::Status WriteJson(const Trace& trace, const std::string& path, const JsonMembers& extra) {
  absl::StatusOr<std::string> json = TraceToJson(trace, extra);
  if (!json.ok()) return json.status();
  return WriteFileBytes(path, absl::StrCat(*json, "\n"), "JSON file");
}

}  // namespace torchlens
