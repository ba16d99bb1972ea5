// What validation asks of saved values: how a recomputed value differs from a saved one,
// how to perturb a parent's value to prove an edge, and whether a value is all finite.
#ifndef TORCHLENS_VALIDATION_VALUES_H_
#define TORCHLENS_VALIDATION_VALUES_H_

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"

namespace torchlens {

// nullopt when `actual` is bit-identical to `expected` (NOTE [Bitwise equality]);
// otherwise what differs ("max abs difference 0.5", "shape [2] instead of [3]"). Never
// throws.
std::optional<std::string> Difference(const at::Tensor& actual, const at::Tensor& expected);

// Whether `actual` equals `expected` up to the rounding of a kernel whose summation order
// varies: same shape and dtype, and for floating and complex values every element within
// 1e-4 of the expected one relative to the larger of 1 and the largest expected magnitude
// (NaN where `expected` has NaN); other dtypes equal exactly. Never throws.
bool CloseUpToRounding(const at::Tensor& actual, const at::Tensor& expected);

// NOTE [Perturbations that can prove]
// Perturbing a parent proves an edge only when the op's output changes. Most ops react to
// the first cheap perturbation (every element changed). Ops that test their input (a
// comparison against a threshold, isnan, any) or that see NaN (where every arithmetic
// perturbation stays NaN) may not, although they depend on it: for them a second round
// tries values chosen without looking at the old ones (extremes, NaN, infinities, one
// element changed, all true or all false). An edge that none of these changes is reported
// as unproved, with the reason, never as a failure: a predicate, a parent holding
// non-finite values, an output that is NaN or infinite everywhere (another argument
// decides it: `NonFiniteEverywhere`), an argument that decides the output only for some
// values (`SometimesDecisive` in torchlens_dispatch/ops/exemptions.h: a fake quantizer's
// on/off switch changes nothing for values on its grid), or an op that for these values
// does not depend on the argument at all (`addmm` with beta=0 does not read its input,
// `pow(1, e)`, `triu(x, 5)` of a 4 x 3 matrix, `x ^ x`). A correct forward pass computes
// such values, and the replay has already shown that the op gives the saved output from
// the saved arguments: an argument that cannot change the output says nothing against
// the trace. The exemptions of NOTE [Data-dependent exemptions] (ops/exemptions.h) are
// the cases the saved values prove, which are not listed at all.

// The `attempt`-th perturbation (0, 1, ...) of a saved value, cheapest first; nullopt when
// there are no more. A quantized value (per-tensor or per-channel affine) is perturbed in
// its integers and keeps its scale and zero point. Random ones draw from the generator
// `generator()` returns, which is called only for them (seeding a generator costs more than most
// perturbations).
std::optional<at::Tensor> Perturbation(const at::Tensor& value, int attempt,
                                       absl::FunctionRef<at::Generator&()> generator);

// Whether every element of a floating or complex strided tensor is finite (true for other
// tensors, and when the check itself fails).
bool AllFinite(const at::Tensor& t);

// Whether `outputs` are all floating or complex, with elements, and NaN or infinite in
// every element: an output that another argument decides whatever a perturbed parent holds
// (`log(x - 10) + torch.ones(...)` with every x below 10, a CTC loss whose targets cannot
// be aligned). Never throws.
bool NonFiniteEverywhere(const std::vector<at::Tensor>& outputs);

}  // namespace torchlens

#endif  // TORCHLENS_VALIDATION_VALUES_H_
