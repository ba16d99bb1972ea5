#include "validation/perturbation_check.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "torchlens_dispatch/ops/exemptions.h"
#include "validation/corner_replay.h"
#include "validation/op_arguments.h"
#include "validation/perturbed_tensors.h"
#include "validation/values.h"

namespace torchlens {

EdgeVerdicts CheckPerturbations(const Op& op, const std::vector<at::Tensor>& saved,
                                const ReplayResult& unperturbed,
                                absl::FunctionRef<at::Generator&()> generator) {
  EdgeVerdicts verdicts;
  // An op whose tensor outputs are all empty has no value a parent could change.
  if (!unperturbed.outputs.empty() &&
      std::all_of(unperturbed.outputs.begin(), unperturbed.outputs.end(),
                  [](const at::Tensor& t) { return t.defined() && t.numel() == 0; })) {
    return verdicts;
  }
  const std::vector<std::vector<int>> perturbed_tensors = PerturbedTensorsByParent(op);
  const std::optional<Corner> corner = FindCorner(op);
  for (size_t p = 0; p < op.parents.size(); ++p) {
    const std::string& parent = op.parents[p];
    // The tensor arguments that come from this parent and can matter.
    const std::vector<int>& indexes = perturbed_tensors[p];
    if (indexes.empty()) continue;
    bool empty = true;
    std::string unperturbable;
    for (int i : indexes) {
      if (i >= static_cast<int>(saved.size())) continue;
      const at::Tensor& value = saved[i];
      empty = empty && value.numel() == 0;
      if (value.layout() != at::kStrided || value.is_meta() ||
          (value.is_quantized() && value.qscheme() != at::kPerTensorAffine &&
           value.qscheme() != at::kPerChannelAffine &&
           value.qscheme() != at::kPerChannelAffineFloatQParams)) {
        unperturbable = value.is_quantized() ? "quantized" : value.is_meta() ? "meta" : "sparse";
      }
    }
    if (empty) continue;
    // A product's other factor that is all zeros (stochastic depth's dropped block,
    // ZeroedByAnotherArgument) exempts the edge. Scanning that factor costs kernels, so
    // it is asked only when the first perturbation did not prove the edge. Either way
    // the edge is no failure; one the first perturbation changed is counted as proved
    // (times zero it can still flip the sign of a zero, which bitwise equality sees).
    const auto zeroed = [&] { return ZeroedByAnotherArgument(op.func_name, saved, indexes); };
    if (!unperturbable.empty()) {
      if (zeroed()) continue;
      verdicts.unproved.push_back(absl::StrCat(op.label, " <- ", parent, ": ", unperturbable,
                                               " values cannot be perturbed"));
      continue;
    }
    // NOTE [Perturbing a corner]: proved on a corner of the input when it can be.
    std::optional<std::vector<c10::IValue>> pair;
    if (corner.has_value()) {
      pair = CornerPairArguments(op, *corner, indexes, [&](const at::Tensor& value) {
        return Perturbation(value, 0, generator);
      });
    }
    if (pair.has_value()) {
      absl::StatusOr<ReplayResult> run = ReplayOp(op, *std::move(pair));
      if (run.ok() && PairSamplesDiffer(*corner, run->outputs)) {
        ++verdicts.proved;
        continue;
      }
    }
    bool reacted = false;
    bool exempt = false;
    for (int attempt = 0; !reacted; ++attempt) {
      if (attempt == 1 && zeroed()) {
        exempt = true;
        break;
      }
      std::vector<c10::IValue> args;
      bool exhausted = false;
      args = ReplayArguments(op, [&](int index, const ArgSource&, const at::Tensor& value) {
        if (exhausted || std::find(indexes.begin(), indexes.end(), index) == indexes.end()) {
          return value;
        }
        std::optional<at::Tensor> perturbed = Perturbation(value, attempt, generator);
        if (!perturbed.has_value()) {
          exhausted = true;
          return value;
        }
        return *perturbed;
      });
      if (exhausted) break;
      absl::StatusOr<ReplayResult> perturbed = ReplayOp(op, std::move(args));
      // An op that rejects the perturbed value depends on it too.
      reacted = !perturbed.ok() || !SameReturns(*perturbed, unperturbed);
    }
    if (exempt) continue;
    if (reacted) {
      ++verdicts.proved;
    } else if (DataDependentlyExempt(op.func_name, ArgumentsOf(op), saved, indexes,
                                     unperturbed.outputs)) {
      // See NOTE [Data-dependent exemptions].
    } else {
      // See NOTE [Perturbations that can prove]: unproved, with the reason, never failed.
      const bool finite = std::all_of(indexes.begin(), indexes.end(), [&](int i) {
        return i >= static_cast<int>(saved.size()) || AllFinite(saved[i]);
      });
      verdicts.unproved.push_back(
          absl::StrCat(op.label, " <- ", parent, ": no perturbation tried changes the output (",
                       !finite ? "the parent holds NaN or infinite values"
                       : NonFiniteEverywhere(unperturbed.outputs)
                           ? "the output is NaN or infinite everywhere, which another "
                             "argument decides whatever this parent holds"
                       : Predicate(op.func_name, unperturbed.outputs) ? "the op is a predicate"
                       : std::all_of(indexes.begin(), indexes.end(),
                                     [&](int i) { return SometimesDecisive(op.func_name, i); })
                           ? "the parent decides the output only for some values"
                           : "for these values the op does not depend on this parent",
                       ")"));
    }
  }
  return verdicts;
}

}  // namespace torchlens
