// What op timing (CaptureOptions::time_ops) says: where the time went, per module, and a
// Chrome trace of the ops nested in their module calls.
//
//   std::map<std::string, int64_t> totals = torchlens::ModuleTotals(*trace);  // ns
//   absl::Status s = torchlens::WriteChromeTrace(*trace, "forward.json");    // Perfetto
#ifndef TORCHLENS_GRAPH_OP_TIMING_H_
#define TORCHLENS_GRAPH_OP_TIMING_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "graph/trace.h"

namespace torchlens {

// Whether any op of the trace was timed.
bool HasOpTimes(const Trace& trace);

// Total time of the timed ops run by each module and its submodules, in nanoseconds, by
// module address ("" the whole forward).
std::map<std::string, int64_t> ModuleTotals(const Trace& trace);

// The Chrome trace event format (chrome://tracing, Perfetto): one complete event per timed
// op (name: label, category: type), inside one event per module call, a run of
// consecutive ops of that module and its submodules. Times in microseconds from the first
// op. kFailedPrecondition when no op was timed.
absl::StatusOr<std::string> ChromeTraceJson(const Trace& trace);
absl::Status WriteChromeTrace(const Trace& trace, const std::string& path);

}  // namespace torchlens

#endif  // TORCHLENS_GRAPH_OP_TIMING_H_
