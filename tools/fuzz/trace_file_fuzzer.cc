// libFuzzer target: the trace-file loader. Any bytes give a Trace or an error status.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "graph/trace_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<char> bytes(reinterpret_cast<const char*>(data),
                                reinterpret_cast<const char*>(data) + size);
  absl::StatusOr<torchlens::Trace> trace = torchlens::ParseTraceFile(bytes);
  if (trace.ok()) {
    for (const torchlens::Op& op : trace->ops()) (void)trace->Find(op.label);
  }
  return 0;
}
