#include "graph/mapping_resident.h"

#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace torchlens {

int64_t ResidentBytesOfMappingAt(const void* address) {
  const auto at = reinterpret_cast<uintptr_t>(address);
  std::ifstream smaps("/proc/self/smaps");
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    // A mapping's first line starts with its range, "start-end", in hex.
    const std::string range = line.substr(0, line.find(' '));
    const std::vector<std::string> ends = absl::StrSplit(range, '-');
    uint64_t start = 0;
    uint64_t end = 0;
    if (ends.size() == 2 && absl::SimpleHexAtoi(ends[0], &start) &&
        absl::SimpleHexAtoi(ends[1], &end)) {
      inside = start <= at && at < end;
      continue;
    }
    int64_t kb = 0;
    if (inside && absl::StartsWith(line, "Rss:") &&
        absl::SimpleAtoi(absl::StripSuffix(absl::StripAsciiWhitespace(line.substr(4)), "kB"),
                         &kb)) {
      return kb * 1024;
    }
  }
  return -1;
}

}  // namespace torchlens
