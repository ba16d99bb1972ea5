#include "tools/bench_validation_floor.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <optional>
#include <utility>

#include "validation/corner_replay.h"
#include "validation/op_arguments.h"
#include "validation/perturbed_tensors.h"
#include "validation/replay.h"
#include "validation/values.h"

namespace torchlens {

std::vector<ReplayCall> ValidationFloorCalls(const Trace& trace) {
  std::vector<ReplayCall> calls;
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(1);
  for (const Op& op : trace.ops()) {
    if (!op.is_compute() || !op.saved()) continue;
    calls.push_back({&op, CapturedArguments(op)});
    const std::vector<std::vector<int>> perturbed_tensors = PerturbedTensorsByParent(op);
    const std::optional<Corner> corner = FindCorner(op);
    for (const std::vector<int>& indexes : perturbed_tensors) {
      const auto first_perturbation = [&](const at::Tensor& t) {
        return Perturbation(t, 0, [&]() -> at::Generator& { return generator; });
      };
      if (corner.has_value()) {
        if (std::optional<std::vector<c10::IValue>> pair =
                CornerPairArguments(op, *corner, indexes, first_perturbation)) {
          calls.push_back({&op, *std::move(pair)});
          continue;
        }
      }
      bool perturbed = false;
      std::vector<c10::IValue> args =
          ReplayArguments(op, [&](int index, const ArgSource&, const at::Tensor& t) {
            if (std::find(indexes.begin(), indexes.end(), index) == indexes.end() || !t.defined() ||
                t.numel() == 0) {
              return t;
            }
            std::optional<at::Tensor> changed = first_perturbation(t);
            perturbed = perturbed || changed.has_value();
            return changed.value_or(t);
          });
      if (perturbed) calls.push_back({&op, std::move(args)});
    }
  }
  return calls;
}

}  // namespace torchlens
