// The calls of the bench's validate_floor row.
#ifndef TORCHLENS_TOOLS_BENCH_VALIDATION_FLOOR_H_
#define TORCHLENS_TOOLS_BENCH_VALIDATION_FLOOR_H_

#include <ATen/core/ivalue.h>

#include <vector>

#include "graph/trace.h"

namespace torchlens {

// The kernel calls validation cannot avoid (README "Validation", its cost): each op with
// saved values once on its saved arguments, and once more per parent whose perturbation it
// checks, with that parent's tensors (PerturbedTensorsByParent, as validation picks them)
// replaced by their first perturbation; for an op with a corner (NOTE [Perturbing a
// corner]) the perturbed run is the run on the corner pair. Built before
// timing, so the floor row times the calls alone.
struct ReplayCall {
  const Op* op;
  std::vector<c10::IValue> args;
};
std::vector<ReplayCall> ValidationFloorCalls(const Trace& trace);

}  // namespace torchlens

#endif  // TORCHLENS_TOOLS_BENCH_VALIDATION_FLOOR_H_
