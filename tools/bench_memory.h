// What the bench measures besides time: the bytes a trace saved (the resident set of a run
// is tools/peak_resident.h).
#ifndef TORCHLENS_TOOLS_BENCH_MEMORY_H_
#define TORCHLENS_TOOLS_BENCH_MEMORY_H_

#include <cstdint>

#include "graph/trace.h"

namespace torchlens {

// Bytes of the distinct storages a trace holds that capture allocated (activations,
// buffer snapshots, generator states), not the parameters or inputs it references.
int64_t SavedBytes(const Trace& trace);

}  // namespace torchlens

#endif  // TORCHLENS_TOOLS_BENCH_MEMORY_H_
