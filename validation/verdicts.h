// What validating a trace found, as lines tagged with the position of the op each is
// about, and the report they become: lines found on several threads merge into trace
// order (NOTE [Validating on several threads] in op_checks.h).
#ifndef TORCHLENS_VALIDATION_VERDICTS_H_
#define TORCHLENS_VALIDATION_VERDICTS_H_

#include <string>
#include <utility>
#include <vector>

#include "graph/trace.h"
#include "validation/validation_report.h"

namespace torchlens {

// The lines of each kind of the ValidationReport, and its counts.
struct Verdicts {
  using Lines = std::vector<std::pair<int, std::string>>;  // (op position, line)
  Lines failures;
  Lines unproved;
  Lines state_transition_only;
  Lines not_checked;
  int ops_checked = 0;
  int perturbations_checked = 0;

  // Takes in what `other` found.
  void Merge(Verdicts&& other);
};

// The report on `trace`: each kind of line in trace order, one line per fact (an op with
// several alias writes replay cannot redo is listed once), with the trace's dead and
// cut-off nodes.
ValidationReport ReportOf(const Trace& trace, Verdicts verdicts);

}  // namespace torchlens

#endif  // TORCHLENS_VALIDATION_VERDICTS_H_
