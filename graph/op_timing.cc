#include "graph/op_timing.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "graph/file_io.h"

namespace torchlens {
namespace {

using Json = nlohmann::ordered_json;

// Sums of a file's op times saturate rather than overflow (each time is checked on load,
// their sum is not).
void AddSaturating(int64_t* total, int64_t ns) {
  if (__builtin_add_overflow(*total, ns, total)) *total = INT64_MAX;
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
  // Each op's time goes to its own module ("" for the model itself), and then each module's
  // total to its parent's. A module's name sorts after its parent's, which is a prefix of
  // it, so one pass from the last name to the first meets every module before its parent.
  // Each name is made once, however many ops ran in it and however deep it nests (made per
  // op and level, a crafted file's 200,000-level addresses cost quadratic time and memory).
  std::map<std::string, int64_t> totals;
  for (const Op& op : trace.ops()) {
    if (op.duration_ns < 0) continue;
    auto [it, added] = totals.try_emplace(op.module_address, 0);
    AddSaturating(&it->second, op.duration_ns);
    // Its ancestors, up to the first one listed already.
    for (std::string name = op.module_address; added && !name.empty();) {
      const size_t dot = name.rfind('.');
      name.resize(dot == std::string::npos ? 0 : dot);
      added = totals.try_emplace(name, 0).second;
    }
  }
  for (auto it = totals.rbegin(); it != totals.rend(); ++it) {
    if (it->first.empty()) continue;
    const size_t dot = it->first.rfind('.');
    AddSaturating(&totals[it->first.substr(0, dot == std::string::npos ? 0 : dot)], it->second);
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
    // The calls open are the modules of the last timed op's address. Those the op's address
    // shares end at a dot (or the end) of both addresses within their common characters:
    // found in one pass over the address, not by comparing module names level by level.
    const absl::string_view address = op.module_address;
    const absl::string_view last = open.empty() ? absl::string_view() : open.back().address;
    const size_t same = static_cast<size_t>(
        std::mismatch(address.begin(), address.begin() + std::min(address.size(), last.size()),
                      last.begin())
            .first -
        address.begin());
    std::vector<size_t> ends;  // where each module of the op's address ends
    for (size_t i = 0; i <= address.size(); ++i) {
      if (i == address.size() || address[i] == '.') {
        if (i > (ends.empty() ? 0 : ends.back() + 1)) ends.push_back(i);
      }
    }
    size_t common = 0;
    while (common < ends.size() && common < open.size() && ends[common] <= same &&
           (ends[common] == last.size() || last[ends[common]] == '.') &&
           open[common].address.size() == ends[common]) {
      ++common;
    }
    close_to(common);
    for (size_t d = common; d < ends.size(); ++d) {
      open.push_back(Call{std::string(address.substr(0, ends[d])), op.start_ns, 0});
    }
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
  // Labels and addresses read from a file may not be UTF-8: replaced, never thrown.
  return root.dump(-1, ' ', false, Json::error_handler_t::replace);
}

absl::Status WriteChromeTrace(const Trace& trace, const std::string& path) {
  absl::StatusOr<std::string> json = ChromeTraceJson(trace);
  if (!json.ok()) return json.status();
  return WriteFileBytes(path, absl::StrCat(*json, "\n"), "Chrome trace");
}

}  // namespace torchlens
