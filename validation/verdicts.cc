#include "validation/verdicts.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "graph/dead_nodes.h"

namespace torchlens {
namespace {

std::vector<std::string> Ordered(Verdicts::Lines* lines) {
  std::stable_sort(lines->begin(), lines->end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::string> ordered;
  ordered.reserve(lines->size());
  size_t group = 0;  // first line of the current position
  for (size_t i = 0; i < lines->size(); ++i) {
    auto& [position, line] = (*lines)[i];
    if (i > 0 && position != (*lines)[i - 1].first) group = ordered.size();
    if (std::find(ordered.begin() + group, ordered.end(), line) != ordered.end()) continue;
    ordered.push_back(std::move(line));
  }
  return ordered;
}

}  // namespace

void Verdicts::Merge(Verdicts&& other) {
  for (Lines Verdicts::*lines : {&Verdicts::failures, &Verdicts::unproved,
                                 &Verdicts::state_transition_only, &Verdicts::not_checked}) {
    (this->*lines).insert((this->*lines).end(), (other.*lines).begin(), (other.*lines).end());
  }
  ops_checked += other.ops_checked;
  perturbations_checked += other.perturbations_checked;
}

ValidationReport ReportOf(const Trace& trace, Verdicts verdicts) {
  ValidationReport report;
  report.failures = Ordered(&verdicts.failures);
  report.unproved = Ordered(&verdicts.unproved);
  report.state_transition_only = Ordered(&verdicts.state_transition_only);
  report.not_checked = Ordered(&verdicts.not_checked);
  for (int index : DeadNodes(trace)) report.dead.push_back(trace.ops()[index].label);
  for (int index : CutOffNodes(trace)) report.cut_off.push_back(trace.ops()[index].label);
  report.ops_checked = verdicts.ops_checked;
  report.perturbations_checked = verdicts.perturbations_checked;
  report.passed = report.failures.empty();
  return report;
}

}  // namespace torchlens
