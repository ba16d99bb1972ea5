#include "graph/dead_nodes.h"

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"

namespace torchlens {

std::vector<int> DeadNodes(const Trace& trace) {
  const std::vector<Op>& ops = trace.ops();
  absl::flat_hash_map<absl::string_view, int> index_of;
  for (size_t i = 0; i < ops.size(); ++i) index_of.emplace(ops[i].label, static_cast<int>(i));
  std::vector<bool> reached(ops.size(), false);
  std::vector<int> frontier;
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    const bool sink = op.is_output() || (op.is_buffer && op.buffer_write_kind.has_value()) ||
                      (op.is_compute() && op.tensor_dtype.empty());  // no tensor result
    if (sink) {
      reached[i] = true;
      frontier.push_back(static_cast<int>(i));
    }
  }
  while (!frontier.empty()) {
    const Op& op = ops[frontier.back()];
    frontier.pop_back();
    for (const std::string& label : op.parents) {
      auto it = index_of.find(label);
      if (it != index_of.end() && !reached[it->second]) {
        reached[it->second] = true;
        frontier.push_back(it->second);
      }
    }
  }
  std::vector<int> dead;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (!reached[i] && !ops[i].is_input()) dead.push_back(static_cast<int>(i));
  }
  return dead;
}

}  // namespace torchlens
