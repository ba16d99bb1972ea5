// What validating a trace found (ValidateForwardPass and ValidateGradients, validate.h).
#ifndef TORCHLENS_VALIDATION_VALIDATION_REPORT_H_
#define TORCHLENS_VALIDATION_VALIDATION_REPORT_H_

#include <string>
#include <vector>

namespace torchlens {

struct ValidationReport {
  bool passed = false;
  int ops_checked = 0;
  std::vector<std::string> failures;  // one line per failed op, naming its label and why
  // Labels of nodes no output or buffer write depends on: replayed and value-checked,
  // never failures.
  std::vector<std::string> dead;
  // Labels of writes replay cannot redo, validated only as state transitions (a write
  // made inside a kernel that is not a known fused mutator, or by several arguments).
  std::vector<std::string> state_transition_only;
  int perturbations_checked = 0;  // parents whose perturbation changed the op's output
  // "op <- parent: why" for edges no perturbation could prove (never failures).
  std::vector<std::string> unproved;
  // Labels of nodes with nothing to check against: ops whose values the capture did not
  // save (NOTE [Selective saving]), and the outputs, buffer versions and alias writes whose
  // value came from one. Never failures.
  std::vector<std::string> not_checked;
  // A halted trace (graph/dead_nodes.h, HaltedForward): labels of the nodes whose readers
  // the halt cut off. Replayed and value-checked like every node; not dead computation,
  // and never failures.
  std::vector<std::string> cut_off;
};

}  // namespace torchlens

#endif  // TORCHLENS_VALIDATION_VALIDATION_REPORT_H_
