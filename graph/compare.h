// Where two runs of a model first differ: two traces matched node by node.
//
//   absl::StatusOr<torchlens::Comparison> diff = torchlens::Compare(reference, candidate);
//   if (diff.ok() && diff->first_divergence.has_value()) {
//     std::cout << "first divergence: " << *diff->first_divergence << "\n";
//   }
//   std::cout << torchlens::FormatComparison(*diff);
//
// Nodes are matched by label (labels are stable from capture to capture of one model, and
// name the same layer and pass in two models of the same code), buffer versions version
// by version. For each matched node the comparison reports how its structure differs
// (operator, parents, shape, dtype) and, when both traces saved its values, the largest
// absolute and relative differences of its outputs. A node diverges when its operator,
// parents or shape differ, or when its values are not close (|a - b| <= atol + rtol * |b|
// everywhere, NaN matching NaN); a dtype difference alone is noted but not a divergence,
// so that a float run can be compared with a double one, value against value.
//
// When both traces hold gradients (CaptureOptions::save_grads, after a backward), each
// matched node's gradients and each parameter's are compared the same way; gradients
// diverge apart from values, and since a backward runs from the outputs back, the first
// gradient divergence is the matched node latest in a's execution order whose gradient
// diverged.
#ifndef TORCHLENS_GRAPH_COMPARE_H_
#define TORCHLENS_GRAPH_COMPARE_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/trace.h"

namespace torchlens {

struct CompareOptions {
  double atol = 1e-6;
  double rtol = 1e-5;
};

struct NodeComparison {
  std::string label;
  std::vector<std::string> differences;  // structural, one line each ("shape [2] vs [3]")
  bool values_compared = false;          // both saved, same shape
  double max_abs_diff = 0.0;             // over every output; infinity for NaN vs a number
  double max_rel_diff = 0.0;             // |a - b| / |b|; infinity where b is zero and a is not
  bool diverged = false;
  // Gradients, when both traces hold them: whether both had one to compare (a gradient in
  // one trace only is a difference and diverges), the largest differences, and whether
  // they are not close.
  bool grads_compared = false;
  double max_abs_grad_diff = 0.0;
  double max_rel_grad_diff = 0.0;
  bool grad_diverged = false;
};

struct Comparison {
  std::vector<std::string> only_in_a;  // labels, in a's order
  std::vector<std::string> only_in_b;  // labels, in b's order
  std::vector<NodeComparison> nodes;   // the matched nodes, in a's execution order
  // The first matched node, in a's execution order, that diverged.
  std::optional<std::string> first_divergence;
  // Gradients (both traces hold them): each parameter's, labelled by address, and the
  // matched node latest in a's execution order whose gradient diverged.
  bool grads_compared = false;
  std::vector<NodeComparison> param_grads;
  std::optional<std::string> first_gradient_divergence;
};

// kInvalidArgument for a negative tolerance.
absl::StatusOr<Comparison> Compare(const Trace& a, const Trace& b, CompareOptions options = {});

// A table in a's execution order: label, max abs and rel difference, structural
// differences, the first divergence marked "<- first divergence"; then the unmatched.
std::string FormatComparison(const Comparison& comparison);

}  // namespace torchlens

#endif  // TORCHLENS_GRAPH_COMPARE_H_
