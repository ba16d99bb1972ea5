// Where the first NaN or infinity came from.
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

}  // namespace torchlens

#endif  // TORCHLENS_GRAPH_NON_FINITE_H_
