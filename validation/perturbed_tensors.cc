#include "validation/perturbed_tensors.h"

#include "absl/container/flat_hash_set.h"
#include "torchlens_dispatch/ops/exemptions.h"
#include "torchlens_dispatch/ops/fused_mutators.h"
#include "validation/replay.h"

namespace torchlens {

std::vector<std::vector<int>> PerturbedTensorsByParent(const Op& op) {
  const FusedMutator* fused = FindFusedMutator(op.func_name);
  const bool updating =
      fused != nullptr && UpdatesState(*fused, c10::ArrayRef<c10::IValue>(op.creation_args.data(),
                                                                          op.creation_args.size()));
  // NOTE [Out arguments]
  // An out= argument is a destination the op overwrites whole (or resizes first): its
  // values before the call never reach the output, so perturbing them proves nothing.
  // Its edge stays (the op writes the parent's tensor), as copy_'s destination's does.
  // Tensor indexes never perturbed: out= arguments and fused state arguments.
  const std::vector<int> out_tensors = OutTensors(op);
  absl::flat_hash_set<int> unperturbed(out_tensors.begin(), out_tensors.end());
  if (updating) {
    const std::vector<int> first = FirstTensorOfArguments(op);
    for (int s = 0; s < fused->num_state_arguments; ++s) {
      const int argument = fused->state_arguments[s];
      if (argument < static_cast<int>(first.size()) && first[argument] >= 0) {
        unperturbed.insert(first[argument]);
      }
    }
  }
  std::vector<std::vector<int>> by_parent(op.parents.size());
  for (size_t p = 0; p < op.parents.size(); ++p) {
    for (int i = 0; i < static_cast<int>(op.arg_sources.size()); ++i) {
      const ArgSource& source = op.arg_sources[i];
      if (source.kind == ArgSource::Kind::kNode && source.node >= 0 &&
          source.node == op.parent_indices[p] && !ShapeOnly(op.func_name, op.overload_name, i) &&
          !UncheckedIndex(op.func_name, i) && !unperturbed.contains(i)) {
        by_parent[p].push_back(i);
      }
    }
  }
  return by_parent;
}

}  // namespace torchlens
