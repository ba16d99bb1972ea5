#include "graph/non_finite.h"

#include <ATen/ATen.h>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace torchlens {
namespace {

struct Finiteness {
  bool nan = false;
  bool inf = false;
};

Finiteness Of(const at::Tensor& value) {
  Finiteness result;
  if (!value.defined() || value.numel() == 0 || value.layout() != at::kStrided ||
      value.is_quantized() || value.is_meta() ||
      !(value.is_floating_point() || value.is_complex())) {
    return result;
  }
  result.nan = at::isnan(value).any().item<bool>();
  result.inf = at::isinf(value).any().item<bool>();
  return result;
}

Finiteness OfOutputs(const Op& op) {
  Finiteness all;
  const std::vector<at::Tensor> single = {op.out};
  for (const at::Tensor& value :
       op.outs.empty() ? absl::MakeConstSpan(single) : absl::Span<const at::Tensor>(op.outs)) {
    const Finiteness one = Of(value);
    all.nan = all.nan || one.nan;
    all.inf = all.inf || one.inf;
  }
  return all;
}

}  // namespace

absl::StatusOr<std::optional<NonFinite>> FirstNonFinite(const Trace& trace) {
  if (!trace.has_saved_values()) {
    return absl::FailedPreconditionError(
        "the trace holds no saved values to look for NaN in: capture with "
        "CaptureOptions::save_activations = true (the default)");
  }
  for (const Op& op : trace.ops()) {
    if (op.is_output()) continue;  // an output holds its parent's value
    const Finiteness finiteness = OfOutputs(op);
    if (!finiteness.nan && !finiteness.inf) continue;
    NonFinite first;
    first.label = op.label;
    first.module_address = op.module_address;
    first.has_nan = finiteness.nan;
    first.has_inf = finiteness.inf;
    for (size_t p = 0; p < op.parents.size(); ++p) {
      const int parent = p < op.parent_indices.size() ? op.parent_indices[p] : -1;
      bool finite = true;
      if (parent >= 0) {
        const Finiteness of_parent = OfOutputs(trace.ops()[parent]);
        finite = !of_parent.nan && !of_parent.inf;
      }
      first.parents.emplace_back(op.parents[p], finite);
    }
    return first;
  }
  return std::optional<NonFinite>();
}

}  // namespace torchlens
