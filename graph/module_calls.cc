#include "graph/module_calls.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace torchlens {
namespace {

// Up to three module addresses sharing the longest prefix with `address`.
std::string Closest(const Trace& trace, absl::string_view address) {
  std::vector<std::pair<size_t, std::string>> scored;
  for (const auto& [candidate, module] : trace.modules()) {
    size_t shared = 0;
    while (shared < candidate.size() && shared < address.size() &&
           candidate[shared] == address[shared]) {
      ++shared;
    }
    scored.emplace_back(shared, candidate.empty() ? "\"\" (the root)" : candidate);
  }
  std::stable_sort(scored.begin(), scored.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<std::string> names;
  for (size_t i = 0; i < scored.size() && i < 3; ++i) names.push_back(scored[i].second);
  return absl::StrJoin(names, ", ");
}

// Whether a reader at `reader` takes a value out of `call` (NOTE [Module calls]).
bool LeavesCall(const Trace& trace, const absl::flat_hash_set<int>& call, int reader) {
  const Op& op = trace.ops()[reader];
  if (op.is_buffer_version()) {  // a version the op wrote: whoever reads it next
    for (int32_t next : op.child_indices) {
      if (next >= 0 && !trace.ops()[next].is_buffer_version() && LeavesCall(trace, call, next))
        return true;
    }
    return false;
  }
  return !call.contains(reader);
}

}  // namespace

absl::StatusOr<std::string> DescribeModuleCalls(const Trace& trace, absl::string_view address) {
  absl::StatusOr<std::vector<ModuleCall>> calls = ModuleCalls(trace, address);
  if (!calls.ok()) return calls.status();
  const std::string& type = trace.modules().at(std::string(address)).type_name;
  std::string out = absl::StrCat("\nModule ", address.empty() ? "\"\" (the root)" : address,
                                 type.empty() ? "" : absl::StrCat(" (", type, ")"), ": ",
                                 calls->size(), calls->size() == 1 ? " call" : " calls", "\n");
  for (const ModuleCall& call : *calls) {
    std::vector<absl::string_view> outputs;
    for (int index : call.outputs) outputs.push_back(trace.ops()[index].label);
    absl::StrAppend(&out, "  call ", call.call, ": ", call.ops.size(),
                    call.ops.size() == 1 ? " op (" : " ops (", trace.ops()[call.ops.front()].label,
                    call.ops.size() == 1 ? "" : " .. ",
                    call.ops.size() == 1 ? "" : trace.ops()[call.ops.back()].label, "), outputs ",
                    outputs.empty() ? "none" : absl::StrJoin(outputs, ", "), "\n");
  }
  return out;
}

bool IsWithinModule(absl::string_view module, absl::string_view address) {
  if (address.empty()) return true;
  return absl::StartsWith(module, address) &&
         (module.size() == address.size() || module[address.size()] == '.');
}

absl::StatusOr<std::vector<ModuleCall>> ModuleCalls(const Trace& trace, absl::string_view address) {
  if (trace.modules().count(std::string(address)) == 0) {
    return absl::NotFoundError(absl::StrCat("the trace has no module \"", address,
                                            "\"; closest: ", Closest(trace, address)));
  }
  std::vector<ModuleCall> calls;
  const std::vector<Op>& ops = trace.ops();
  bool in_call = false;
  int first_layer = -1;  // the layer that began the current call
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    if (!op.is_compute()) continue;
    if (!IsWithinModule(op.module_address, address)) {
      in_call = false;
      continue;
    }
    if (!in_call || op.layer_step_index == first_layer) {  // a call begins
      calls.push_back(ModuleCall{std::string(address), static_cast<int>(calls.size()) + 1});
      first_layer = op.layer_step_index;
      in_call = true;
    }
    calls.back().ops.push_back(static_cast<int>(i));
  }
  for (ModuleCall& call : calls) {
    const absl::flat_hash_set<int> members(call.ops.begin(), call.ops.end());
    for (int index : call.ops) {
      const auto& readers = ops[index].child_indices;
      if (std::any_of(readers.begin(), readers.end(), [&](int32_t reader) {
            return reader >= 0 && LeavesCall(trace, members, reader);
          })) {
        call.outputs.push_back(index);
      }
    }
  }
  return calls;
}

absl::StatusOr<std::vector<std::vector<const Op*>>> FindModuleOutputs(const Trace& trace,
                                                                      absl::string_view address) {
  absl::StatusOr<std::vector<ModuleCall>> calls = ModuleCalls(trace, address);
  if (!calls.ok()) return calls.status();
  std::vector<std::vector<const Op*>> outputs;
  for (const ModuleCall& call : *calls) {
    std::vector<const Op*>& ops = outputs.emplace_back();
    for (int index : call.outputs) ops.push_back(&trace.ops()[index]);
  }
  return outputs;
}

}  // namespace torchlens
