// A buffer's history under TorchLens's names, as trace files list it.
//
// NOTE [The buffer entity in trace files]
// Each buffer of a trace file carries TorchLens's names for its state: `versions` (the
// labels of its version nodes, the initial read first), `num_overwrites` and `write_kinds`
// (one per write, in order: "inplace", "reassign", "fused"), so that Python reads a
// buffer's history without rebuilding it from the ops. The reader rebuilds them from the
// ops all the same, as it always did, and refuses a file whose lists say otherwise; files
// written before the lists existed load as before.
#ifndef TORCHLENS_GRAPH_BUFFER_SUMMARY_H_
#define TORCHLENS_GRAPH_BUFFER_SUMMARY_H_

#include <string>
#include <vector>

#include "graph/trace.h"

namespace torchlens {

struct BufferSummary {
  std::vector<std::string> versions;     // labels of its version nodes, the initial read first
  std::vector<std::string> write_kinds;  // WriteKindName of each write, in order
};

// The summary of `buffer`'s version nodes.
BufferSummary SummarizeBuffer(const Buffer& buffer);

}  // namespace torchlens

#endif  // TORCHLENS_GRAPH_BUFFER_SUMMARY_H_
