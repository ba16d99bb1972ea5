// Peak CPU-allocator memory of this thread while a call runs, for the benchmark and the
// memory tests (allocator accounting, not timing):
//
//   const int64_t peak = torchlens::PeakAllocatedDuring([&] { model.forward(inputs); });
//
// LibTorch reports every allocation and free of the thread to its memory-profiling hook;
// a buffer allocated on this thread and freed on another counts here forever.
#ifndef TORCHLENS_TOOLS_ALLOCATOR_PEAK_H_
#define TORCHLENS_TOOLS_ALLOCATOR_PEAK_H_

#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>

namespace torchlens {

// The peak, in bytes above what the thread held when `run` started.
inline int64_t PeakAllocatedDuring(const std::function<void()>& run) {
  class Probe : public c10::MemoryReportingInfoBase {
   public:
    void reportMemoryUsage(void*, int64_t bytes, int64_t, int64_t, c10::Device) override {
      current_ += bytes;
      peak_ = std::max(peak_, current_);
    }
    bool memoryProfilingEnabled() const override { return true; }
    int64_t peak() const { return peak_; }

   private:
    int64_t current_ = 0;
    int64_t peak_ = 0;
  };
  auto probe = std::make_shared<Probe>();
  {
    c10::DebugInfoGuard guard(c10::DebugInfoKind::PROFILER_STATE, probe);
    run();
  }
  return probe->peak();
}

}  // namespace torchlens

#endif  // TORCHLENS_TOOLS_ALLOCATOR_PEAK_H_
