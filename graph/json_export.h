// A trace's metadata as JSON (no tensor values), for tools and other languages.
//
// Schema "torchlens.trace.json", version 3 (version 1 had no "source_position", version 2
// no gradients); every field:
//   {
//     "schema": "torchlens.trace.json", "version": 3,
//     "training": bool, "has_saved_values": bool,
//     "partial_reason": "" for a complete trace, else why it is partial,
//     "ops": [ {the metadata fields of NOTE [One Op field table] (graph/op_fields.h),
//               in its order: "label", "type", ..., with
//               "buffer_write_kind": null | "reassign" | "inplace" | "fused",
//               "buffer_value_changed": null | bool,
//               "arg_sources": [ {"kind": "node"|"param"|"constant"|"none", "name",
//                                 "output_index"} ],
//               "alias_writes": [ {"before": {"kind", "name", "output_index"},
//                                  "written_tensor", "aliased": {"sizes", "strides",
//                                  "storage_offset"}, "written": {...}} ],
//               "start_ns", "duration_ns" (-1 when not timed),
//               "source_position": null | {"file", "line", "column", "text",
//                                  "branches": [ {"file", "line", "text",
//                                                 "taken": "then"|"else"} ]},
//               "forward_label" ("" but for backward ops),
//               "grad_norm": null | the L2 norm of its gradient} ],
//     "records_gradients": bool (CaptureOptions::save_grads),
//     "backward_ops": [ {the same fields, for each op of the latest backward, in execution
//                        order (NOTE [Gradients in a trace] in graph/gradients.h)} ],
//     "param_grad_norms": {address: the L2 norm of its gradient},
//     "buffers": [ {"address", "module_address", "versions": [label], "num_overwrites",
//                   "write_kinds": ["inplace"|"reassign"|"fused", one per write],
//                   "same_tensor_as": [address], "shares_storage_with": [address],
//                   "shape": [int], "dtype"} ],
//     "modules": [ {"address", "type_name", "buffers": [address], "params": [address],
//                   "grad_norm": null | the L2 norm of its parameters' gradients} ],
//     "params": [ {"address", "shape": [int], "module_address"} ],
//     "diagnostics": [ {"address", "message", "label"} ],
//     "capture_stats": {"user_ops", "nested_ops", ...},
//     ...extra members given by the caller (the command-line tool adds "validation")
//   }
// Ops appear in execution order; buffers, modules and params sorted by address.
#ifndef TORCHLENS_GRAPH_JSON_EXPORT_H_
#define TORCHLENS_GRAPH_JSON_EXPORT_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "graph/trace.h"

namespace torchlens {

inline constexpr char kJsonSchema[] = "torchlens.trace.json";
inline constexpr int kJsonSchemaVersion = 3;

// Extra top-level members: each a name and a JSON document.
using JsonMembers = std::vector<std::pair<std::string, std::string>>;

// Indented JSON text. kInvalidArgument when an extra member is not valid JSON.
absl::StatusOr<std::string> TraceToJson(const Trace& trace, const JsonMembers& extra = {});

// Writes TraceToJson(trace, extra) to `path`; errors as WriteFileBytes (file_io.h) gives them.
absl::Status WriteJson(const Trace& trace, const std::string& path, const JsonMembers& extra = {});

}  // namespace torchlens

#endif  // TORCHLENS_GRAPH_JSON_EXPORT_H_
