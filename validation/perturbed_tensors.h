// Which of an op's tensor arguments validation perturbs to prove each edge (NOTE
// [Perturbations that can prove] in values.h). Shared by ValidateForwardPass and the
// bench's floor row, which times the same perturbed replays.
#ifndef TORCHLENS_VALIDATION_PERTURBED_TENSORS_H_
#define TORCHLENS_VALIDATION_PERTURBED_TENSORS_H_

#include <vector>

#include "graph/trace.h"

namespace torchlens {

// For each of `op.parents`, in order, the indexes (ForEachTensor order over
// `op.creation_args`) of the tensor arguments that came from it and can change the
// output: all of them except arguments read only for their shape, indexes that are never
// perturbed (torchlens_dispatch/ops/exemptions.h), and the running statistics of a fused
// mutator that updates them (torchlens_dispatch/ops/fused_mutators.h).
std::vector<std::vector<int>> PerturbedTensorsByParent(const Op& op);

}  // namespace torchlens

#endif  // TORCHLENS_VALIDATION_PERTURBED_TENSORS_H_
