// What the bench measures besides time: the resident set of a run, and the bytes a trace
// saved.
#ifndef TORCHLENS_TOOLS_BENCH_MEMORY_H_
#define TORCHLENS_TOOLS_BENCH_MEMORY_H_

#include <cstdint>
#include <functional>

#include "graph/trace.h"

namespace torchlens {

// Peak resident set of the process while `run` runs, in bytes: the kernel's high-water
// mark, reset first (writing 5 to /proc/self/clear_refs), so that it counts the page cache
// pages a run maps and touches as well as its heap. -1 when the kernel does not allow it.
int64_t PeakResidentDuring(const std::function<void()>& run);

// Bytes of the distinct storages a trace holds that capture allocated (activations,
// buffer snapshots, generator states), not the parameters or inputs it references.
int64_t SavedBytes(const Trace& trace);

}  // namespace torchlens

#endif  // TORCHLENS_TOOLS_BENCH_MEMORY_H_
