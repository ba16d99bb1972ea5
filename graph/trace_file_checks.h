// The checks a trace file passes before it becomes a Trace. A trace file is untrusted input
// (graph/HOSTILE_INPUTS.md): each field has been read with its type checked, and these
// checks refuse the parts that contradict each other, so that a crafted file cannot make
// the summary, validation or replay present what it does not hold. Each returns
// kInvalidArgument with a message that begins "malformed trace file: " and names the op,
// buffer or address at fault.
#ifndef TORCHLENS_GRAPH_TRACE_FILE_CHECKS_H_
#define TORCHLENS_GRAPH_TRACE_FILE_CHECKS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "graph/buffer_summary.h"
#include "graph/trace.h"

namespace torchlens {

// Labels are unique (the edges name them), every parent is an earlier op (NOTE [Node
// order] in build_trace.cc), times are -1 or nanoseconds that do not overflow, and an op's
// recorded shape and dtype are its saved value's.
absl::Status CheckConsistent(const std::vector<Op>& ops);

// Gradients that contradict the ops: a gradient of another shape than its value, a backward
// op linked to a node the trace does not have, or edges to backward ops it does not list.
absl::Status CheckGradients(const TraceParts& parts);

// Every module address (of ops, modules, params and buffers) is module names joined by
// single dots, of bounded depth and length.
absl::Status CheckModuleAddresses(const TraceParts& parts);

// What a file lists for a buffer (NOTE [The buffer entity in trace files] in
// graph/buffer_summary.h), by address.
struct ListedBuffer {
  BufferSummary summary;
  int64_t num_overwrites = 0;
};

// Each listed buffer's versions, write kinds and overwrites are those `trace`'s ops give.
absl::Status CheckListedBuffers(const Trace& trace,
                                const std::map<std::string, ListedBuffer>& listed);

}  // namespace torchlens

#endif  // TORCHLENS_GRAPH_TRACE_FILE_CHECKS_H_
