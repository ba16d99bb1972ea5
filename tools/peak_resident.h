// The peak resident set of the process while something runs (the bench, the zoo).
#ifndef TORCHLENS_TOOLS_PEAK_RESIDENT_H_
#define TORCHLENS_TOOLS_PEAK_RESIDENT_H_

#include <cstdint>
#include <functional>

namespace torchlens {

// Peak resident set of the process while `run` runs, in bytes: the kernel's high-water
// mark, reset first (writing 5 to /proc/self/clear_refs), so that it counts the page cache
// pages a run maps and touches as well as its heap. The heap malloc holds free is given
// back before the reset, so that the mark starts from what the process uses, not from what
// earlier runs left. -1 when the kernel does not allow it.
int64_t PeakResidentDuring(const std::function<void()>& run);

}  // namespace torchlens

#endif  // TORCHLENS_TOOLS_PEAK_RESIDENT_H_
