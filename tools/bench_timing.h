// Timing helpers of the bench (bench_forward.cc, bench_backward.cc, bench_scaling.cc).
#ifndef TORCHLENS_TOOLS_BENCH_TIMING_H_
#define TORCHLENS_TOOLS_BENCH_TIMING_H_

#include <functional>
#include <vector>

namespace torchlens {

// The median of `values` (0 when empty).
double Median(std::vector<double> values);

// Allocates and frees 256 KiB, which makes glibc merge the small blocks freed before
// (NOTE [Each run pays for its own frees] in bench_timing.cc).
void ConsolidateFrees();

// Wall time of one call, in microseconds, including the merging of what it freed unless
// `consolidate_frees` is false.
double MicrosOf(const std::function<void()>& run, bool consolidate_frees = true);

}  // namespace torchlens

#endif  // TORCHLENS_TOOLS_BENCH_TIMING_H_
