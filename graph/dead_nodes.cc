#include "graph/dead_nodes.h"

namespace torchlens {

std::vector<int> DeadNodes(const Trace& trace) {
  const std::vector<Op>& ops = trace.ops();
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
    for (int32_t parent : op.parent_indices) {
      if (parent >= 0 && !reached[parent]) {
        reached[parent] = true;
        frontier.push_back(parent);
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
