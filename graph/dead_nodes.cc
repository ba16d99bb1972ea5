#include "graph/dead_nodes.h"

#include "absl/strings/match.h"

namespace torchlens {
namespace {

// Nodes no sink (an output, a buffer write, an op whose result leaves the graph) reads.
std::vector<int> Unread(const Trace& trace) {
  const std::vector<Op>& ops = trace.ops();
  std::vector<bool> reached(ops.size(), false);
  std::vector<int> frontier;
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    const bool sink = op.is_output() ||
                      (op.is_buffer_version() && op.buffer_write_kind.has_value()) ||
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

}  // namespace

bool HaltedForward(const Trace& trace) {
  return trace.partial() && absl::StartsWith(trace.partial_reason(), "the forward was halted");
}

std::vector<int> DeadNodes(const Trace& trace) {
  return HaltedForward(trace) ? std::vector<int>() : Unread(trace);
}

std::vector<int> CutOffNodes(const Trace& trace) {
  return HaltedForward(trace) ? Unread(trace) : std::vector<int>();
}

}  // namespace torchlens
