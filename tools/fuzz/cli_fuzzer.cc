// libFuzzer target: the command-line tool's value parsers and flag parsing.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tools/cli_flags.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<std::vector<std::vector<int64_t>>> shapes = torchlens::ParseInputShapes(text);
  if (shapes.ok()) {
    for (const auto& shape : *shapes) {
      int64_t elements = 1;
      for (int64_t d : shape) {
        if (d < 0) __builtin_trap();
        elements = d == 0 ? 0 : elements;
        if (d > 0 && elements > (int64_t{1} << 31) / d) __builtin_trap();  // bound promised
        elements *= d;
      }
    }
  }
  (void)torchlens::ParseEdit(text);
  // The same bytes as an argument vector, split at NUL.
  std::vector<std::string> args;
  size_t start = 0;
  for (size_t i = 0; i <= text.size(); ++i) {
    if (i == text.size() || text[i] == '\0') {
      args.push_back(text.substr(start, i - start));
      start = i + 1;
    }
  }
  (void)torchlens::ParseCommandLine(args);
  return 0;
}
