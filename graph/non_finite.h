// Where the first NaN or infinity came from, in the forward's values or in the gradients.
//
//   absl::StatusOr<std::optional<torchlens::NonFinite>> first = torchlens::FirstNonFinite(*trace);
//   if (first.ok() && first->has_value()) {
//     std::cout << (*first)->label << " in '" << (*first)->module_address << "'\n";
//   }
#ifndef TORCHLENS_GRAPH_NON_FINITE_H_
#define TORCHLENS_GRAPH_NON_FINITE_H_

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/trace.h"

namespace torchlens {

struct NonFinite {
  std::string label;           // the first node, in execution order, holding NaN or Inf
  std::string module_address;  // the module that ran it
  bool has_nan = false;
  bool has_inf = false;
  // Its parents, in order, each with whether all of its values are finite: the op that
  // made the first non-finite value from finite inputs has only finite parents.
  std::vector<std::pair<std::string, bool>> parents;
};

// The first op, input, constant or buffer version whose saved value (any output) holds
// NaN or an infinity, or nullopt when every value is finite. Only floating-point and
// complex values can hold them. kFailedPrecondition for a trace without saved values.
absl::StatusOr<std::optional<NonFinite>> FirstNonFinite(const Trace& trace);

// Where a gradient first became NaN or infinite, in the order the latest backward
// computed them (NOTE [Gradients in a trace] in graph/gradients.h).
struct NonFiniteGradient {
  std::string label;           // the node, or the parameter's address
  bool is_param = false;       // `label` is a parameter's address
  std::string module_address;  // the module that ran it (that owns the parameter)
  bool has_nan = false;
  bool has_inf = false;
  // The backward op that runs first for it (autograd's node of its value), or empty.
  std::string backward_op;
  // The nodes that read it, whose backward gave it its gradient, each with whether its own
  // gradient is finite: the first non-finite gradient made from finite ones has only
  // finite readers' gradients. For a parameter, the ops that read it.
  std::vector<std::pair<std::string, bool>> readers;
};

//   absl::StatusOr<std::optional<torchlens::NonFiniteGradient>> first =
//       torchlens::FirstNonFiniteGradient(*trace);
//
// The first node (or parameter) whose gradient holds NaN or an infinity, following the
// backward ops in execution order (a value's gradient is complete when its first backward
// op runs), or nullopt when every gradient is finite. Values without backward ops (a trace
// whose backward ops were not kept) come last, latest first. kFailedPrecondition for a
// trace without gradients (captured without save_grads).
absl::StatusOr<std::optional<NonFiniteGradient>> FirstNonFiniteGradient(const Trace& trace);

}  // namespace torchlens

#endif  // TORCHLENS_GRAPH_NON_FINITE_H_
