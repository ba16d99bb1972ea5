#include "graph/op_timing.h"

#include <algorithm>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
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
  // Each op's time goes to its own module, then each module's total to its parent's,
  // deepest modules first: every module name is made once, however many ops ran in it and
  // however deep it nests (one op's ancestors made anew per op cost a crafted file of
  // 200,000-level addresses quadratic time and memory).
  absl::flat_hash_map<std::string, int64_t> own;
  int64_t all = 0;
  bool any = false;
  for (const Op& op : trace.ops()) {
    if (op.duration_ns < 0) continue;
    any = true;
    AddSaturating(&all, op.duration_ns);
    if (!op.module_address.empty()) AddSaturating(&own[op.module_address], op.duration_ns);
  }
  std::vector<std::pair<size_t, std::string>> by_depth;  // (dots, address)
  std::vector<std::string> pending;
  for (const auto& [address, ns] : own) pending.push_back(address);
  while (!pending.empty()) {
    std::string address = std::move(pending.back());
    pending.pop_back();
    const size_t dot = address.rfind('.');
    if (dot != std::string::npos && own.try_emplace(address.substr(0, dot), 0).second) {
      pending.push_back(address.substr(0, dot));
    }
    by_depth.emplace_back(static_cast<size_t>(std::count(address.begin(), address.end(), '.')),
                          std::move(address));
  }
  std::sort(by_depth.begin(), by_depth.end(), std::greater<>());
  std::map<std::string, int64_t> totals;
  if (any) totals[""] = all;
  for (const auto& [dots, address] : by_depth) {
    const int64_t ns = own[address];
    const size_t dot = address.rfind('.');
    if (dot != std::string::npos) AddSaturating(&own[address.substr(0, dot)], ns);
    totals.emplace(address, ns);
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
