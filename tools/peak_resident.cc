#include "tools/peak_resident.h"

#include <malloc.h>

#include <fstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"

namespace torchlens {

int64_t PeakResidentDuring(const std::function<void()>& run) {
  // Freed heap that malloc keeps stays resident: without giving it back, a run after a
  // larger one would report the larger one's peak.
  ::malloc_trim(0);
  {
    std::ofstream clear("/proc/self/clear_refs");
    clear << "5";
    if (!clear.good()) return -1;
  }
  run();
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    int64_t kb = 0;
    if (line.rfind("VmHWM:", 0) == 0 &&
        absl::SimpleAtoi(absl::StripAsciiWhitespace(absl::StripSuffix(line.substr(6), "kB")),
                         &kb)) {
      return kb * 1024;
    }
  }
  return -1;
}

}  // namespace torchlens
