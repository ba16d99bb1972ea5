// Trace files: a whole trace, metadata and saved tensors, in PyTorch's own serialization.
//
// C++:     absl::Status s = torchlens::SaveTrace(*trace, "trace.pt");
//          absl::StatusOr<torchlens::Trace> loaded = torchlens::LoadTrace("trace.pt");
// Python:  t = torch.load("trace.pt")
//          t["format"] == "torchlens.trace"; t["ops"][1]["label"] == "linear_1_1:1"
//          t["ops"][1]["out"]  # the saved tensor
//
// The file is what `torch::pickle_save` writes (the zip format of `torch.save`): a dict with
// "format", "version", "training", "has_saved_values", "partial_reason" (empty for a
// complete trace; files without it load as complete), and lists "ops", "buffers",
// "modules", "params", "diagnostics", plus "capture_stats". Each op is a dict with the
// fields of NOTE [One Op field table] (graph/op_fields.h) under the names of `Op`'s
// members, in its order, and "creation_args_complete" (false when an argument could not be
// written, and "creation_args" is then empty); tensors as tensors, `None` when absent. Each buffer
// has "address", "module_address", "initial_value", "final_value", "same_tensor_as" and
// "shares_storage_with" (lists of addresses; absent from older files, which load with
// both empty). Tensors shared by
// several ops are stored once. LoadTrace gives back an equal `Trace`: same labels, edges,
// buffer entities, and bit-identical tensors. Version 2 added each op's "alias_writes"
// (dicts of "before", "written_tensor", "aliased" and "written" geometries, "value") and
// each diagnostic's "label", and each op's "start_ns" and "duration_ns". Version 3 added
// each op's "source_position": `None`, or a dict of "file", "line", "column", "text" and
// "branches" (dicts of "file", "line", "text", "taken": "then" or "else"). Version 4 added
// gradients (NOTE [Gradients in a trace] in graph/gradients.h): each op's "forward_label",
// "grad" and "grads", and "records_gradients", "backward_ops" (op dicts) and "param_grads"
// (address -> tensor). Files of earlier versions, which lack those fields, still load.
#ifndef TORCHLENS_GRAPH_TRACE_FILE_H_
#define TORCHLENS_GRAPH_TRACE_FILE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "graph/trace.h"

namespace torchlens {

inline constexpr char kTraceFileFormat[] = "torchlens.trace";
inline constexpr int kTraceFileVersion = 4;

// kInvalidArgument, writing nothing, when a tensor of the trace is sparse (or of another
// non-strided layout): LibTorch 1.13 would write it in a form Python's torch.load cannot
// read. Write errors as WriteFileBytes (file_io.h) gives them.
absl::Status SaveTrace(const Trace& trace, const std::string& path);

// kNotFound: no such file. kInvalidArgument: not a trace file, truncated or corrupt (the
// bytes are checked and read by torch_load.h, never by LibTorch's unpickler), or not a
// file (graph/file_io.h). kFailedPrecondition: a trace file of another version.
//
// NOTE [Values read on use]
// A regular file is mapped, not read (ReadLimits::page_on_use): the trace's tensors are
// made over the file's records in place, and a value's bytes are read from disk the first
// time it is used, so that loading a trace larger than memory costs its metadata. The
// library's walks over a loaded trace (validation, Compare, FirstNonFinite, Do) give each
// value's pages back after its last use (NOTE [Releasing after the last use] in
// graph/release_after_last_use.h), so they keep a working set resident, not the file. The
// mapping lives as long as any tensor of the trace. Writing a loaded tensor changes this
// process's copy, never the file. As with any mapped file, truncating the file while a
// loaded trace is in use ends the process with SIGBUS when a cut value is read.
absl::StatusOr<Trace> LoadTrace(const std::string& path);

// The same, from the bytes of a file (for tests and fuzzing).
absl::StatusOr<Trace> ParseTraceFile(const std::vector<char>& bytes);

// The value SaveTrace pickles for `trace`, after the same check (for
// graph/trace_file_writer.h, which writes it with tensors already on disk).
absl::StatusOr<c10::IValue> TraceFileValue(const Trace& trace);

}  // namespace torchlens

#endif  // TORCHLENS_GRAPH_TRACE_FILE_H_
