#include "graph/op_timing.h"

#include <nlohmann/json.hpp>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "graph/file_io.h"

namespace torchlens {
namespace {

using Json = nlohmann::ordered_json;

// "a.b.c" -> {"a", "a.b", "a.b.c"}.
std::vector<std::string> ModulePath(const std::string& address) {
  std::vector<std::string> path;
  std::string prefix;
  for (absl::string_view part : absl::StrSplit(address, '.', absl::SkipEmpty())) {
    prefix = prefix.empty() ? std::string(part) : absl::StrCat(prefix, ".", part);
    path.push_back(prefix);
  }
  return path;
}

Json Event(const std::string& name, const std::string& category, int64_t start_ns, int64_t end_ns) {
  return {{"name", name},
          {"cat", category},
          {"ph", "X"},
          {"ts", static_cast<double>(start_ns) / 1e3},
          {"dur", static_cast<double>(end_ns - start_ns) / 1e3},
          {"pid", 1},
          {"tid", 1}};
}

}  // namespace

bool HasOpTimes(const Trace& trace) {
  for (const Op& op : trace.ops()) {
    if (op.duration_ns >= 0) return true;
  }
  return false;
}

std::map<std::string, int64_t> ModuleTotals(const Trace& trace) {
  std::map<std::string, int64_t> totals;
  for (const Op& op : trace.ops()) {
    if (op.duration_ns < 0) continue;
    totals[""] += op.duration_ns;
    for (const std::string& module : ModulePath(op.module_address))
      totals[module] += op.duration_ns;
  }
  return totals;
}

absl::StatusOr<std::string> ChromeTraceJson(const Trace& trace) {
  if (!HasOpTimes(trace)) {
    return absl::FailedPreconditionError(
        "the trace has no op times: capture with CaptureOptions::time_ops = true");
  }
  Json events = Json::array();
  // The module calls open around the current op, outermost first: (address, start, end).
  struct Call {
    std::string address;
    int64_t start_ns;
    int64_t end_ns;
  };
  std::vector<Call> open;
  auto close_to = [&](size_t depth) {
    while (open.size() > depth) {
      const Call& call = open.back();
      events.push_back(Event(call.address, "module", call.start_ns, call.end_ns));
      open.pop_back();
    }
  };
  for (const Op& op : trace.ops()) {
    if (op.duration_ns < 0) continue;
    const std::vector<std::string> path = ModulePath(op.module_address);
    size_t common = 0;
    while (common < open.size() && common < path.size() && open[common].address == path[common]) {
      ++common;
    }
    close_to(common);
    for (size_t d = common; d < path.size(); ++d) open.push_back(Call{path[d], op.start_ns, 0});
    const int64_t end_ns = op.start_ns + op.duration_ns;
    for (Call& call : open) call.end_ns = std::max(call.end_ns, end_ns);
    Json event = Event(op.label, op.type, op.start_ns, end_ns);
    event["args"] = {{"module", op.module_address}, {"op", op.func_name}};
    events.push_back(std::move(event));
  }
  close_to(0);
  Json root;
  root["traceEvents"] = std::move(events);
  root["displayTimeUnit"] = "ns";
  return root.dump();
}

absl::Status WriteChromeTrace(const Trace& trace, const std::string& path) {
  absl::StatusOr<std::string> json = ChromeTraceJson(trace);
  if (!json.ok()) return json.status();
  return WriteFileBytes(path, absl::StrCat(*json, "\n"), "Chrome trace");
}

}  // namespace torchlens
