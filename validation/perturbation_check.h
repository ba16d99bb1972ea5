// Proving an op's edges by perturbation: re-run with the tensors one parent gave it
// changed, the op must give another output, or that parent is not shown to matter (NOTE
// [Perturbations that can prove] in values.h). One of the checks of an op (op_checks.h).
#ifndef TORCHLENS_VALIDATION_PERTURBATION_CHECK_H_
#define TORCHLENS_VALIDATION_PERTURBATION_CHECK_H_

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "graph/trace.h"
#include "validation/replay.h"

namespace torchlens {

struct EdgeVerdicts {
  int proved = 0;                     // parents a perturbation showed to matter
  std::vector<std::string> unproved;  // one line per parent none did, saying why
};

// The edges of `op` (each of `op.parents`) checked by perturbing the tensors that came from
// them: first on a corner of the input (NOTE [Perturbing a corner] in corner_replay.h), then
// whole values, cheapest perturbation first. `saved`: the op's saved tensor arguments, in
// ForEachTensor order; `unperturbed`: its replay from them. Random perturbations draw from
// `generator()`, asked only when one is needed. Exempt edges (NOTE [Data-dependent
// exemptions] in torchlens_dispatch/ops/exemptions.h) are neither proved nor unproved.
EdgeVerdicts CheckPerturbations(const Op& op, const std::vector<at::Tensor>& saved,
                                const ReplayResult& unperturbed,
                                absl::FunctionRef<at::Generator&()> generator);

}  // namespace torchlens

#endif  // TORCHLENS_VALIDATION_PERTURBATION_CHECK_H_
