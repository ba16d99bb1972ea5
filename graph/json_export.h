// A trace's metadata as JSON (no tensor values), for tools and other languages.
//
// Schema "torchlens.trace.json", version 1 (README "JSON schema" describes every field):
//   {
//     "schema": "torchlens.trace.json", "version": 1,
//     "training": bool, "has_saved_values": bool,
//     "ops": [ {"label", "type", "func_name", "overload_name", "pass", "layer_type_index",
//               "layer_step_index", "module_address", "parents": [label], "children":
//               [label], "parent_params": [address], "tensor_shape": [int],
//               "tensor_dtype", "is_buffer", "address", "buffer_pass",
//               "buffer_write_kind": null | "reassign" | "inplace" | "fused",
//               "buffer_value_changed": null | bool,
//               "arg_sources": [ {"kind": "node"|"param"|"constant"|"none", "name",
//                                 "output_index"} ]} ],
//     "buffers": [ {"address", "module_address", "versions": [label], "num_overwrites",
//                   "shape": [int], "dtype"} ],
//     "modules": [ {"address", "type_name", "buffers": [address], "params": [address]} ],
//     "params": [ {"address", "shape": [int], "module_address"} ],
//     "diagnostics": [ {"address", "message"} ],
//     "capture_stats": {"user_ops", "nested_ops", ...}
//   }
// Ops appear in execution order; buffers, modules and params sorted by address.
#ifndef TORCHLENS_GRAPH_JSON_EXPORT_H_
#define TORCHLENS_GRAPH_JSON_EXPORT_H_

#include <string>

#include "absl/status/status.h"
#include "graph/trace.h"

namespace torchlens {

inline constexpr char kJsonSchema[] = "torchlens.trace.json";
inline constexpr int kJsonSchemaVersion = 1;

// Indented JSON text.
std::string TraceToJson(const Trace& trace);

// Writes TraceToJson(trace) to `path`; errors as WriteFileBytes (file_io.h) gives them.
absl::Status WriteJson(const Trace& trace, const std::string& path);

}  // namespace torchlens

#endif  // TORCHLENS_GRAPH_JSON_EXPORT_H_
