#include "tools/bench_timing.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>

namespace torchlens {

using Clock = std::chrono::steady_clock;

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values.empty() ? 0.0 : values[values.size() / 2];
}

// NOTE [Each run pays for its own frees]
// glibc keeps freed small blocks in its fast bins and merges them into free space only
// when some later allocation of a large block asks for it (malloc_consolidate), whichever
// code makes that allocation. A plain forward frees thousands of small blocks and
// allocates nothing large, so without care its merging is done, and timed, in the capture
// that follows it: on a 2,000-layer MLP that charged the capture 0.1-0.2 us per op of
// the plain forward's work (README "Performance"). Each timed run therefore ends, inside
// its timing, with one allocation of 256 KiB, which merges what the run itself freed.
// glibc's policy is unchanged; only who is charged for it. In a service that only runs
// plain forwards nobody pays for that merging (freed blocks are reused as they are), so
// the scaling pairs are also measured with frees left to glibc, and printed both ways.
void ConsolidateFrees() {
  void* volatile block = std::malloc(256 << 10);  // volatile: the pair must not be elided
  std::free(block);
}

double MicrosOf(const std::function<void()>& run, bool consolidate_frees) {
  const auto start = Clock::now();
  run();
  if (consolidate_frees) ConsolidateFrees();
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
}

}  // namespace torchlens
