#include "graph/non_finite.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "graph/release_after_last_use.h"

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

// Whether any of an op's values holds NaN or Inf: `values` when the op has several (its
// outputs, their gradients), else `first` alone.
Finiteness OfAll(const at::Tensor& first, absl::Span<const at::Tensor> values) {
  if (values.empty()) return Of(first);
  Finiteness all;
  for (const at::Tensor& value : values) {
    const Finiteness one = Of(value);
    all.nan = all.nan || one.nan;
    all.inf = all.inf || one.inf;
  }
  return all;
}

Finiteness OfOutputs(const Op& op) { return OfAll(op.out, absl::Span<const at::Tensor>(op.outs)); }

Finiteness OfGrads(const Op& op) { return OfAll(op.grad, op.grads); }

}  // namespace

absl::StatusOr<std::optional<NonFinite>> FirstNonFinite(const Trace& trace) {
  if (!trace.has_saved_values()) {
    return absl::FailedPreconditionError(
        "the trace holds no saved values to look for NaN in: capture with "
        "CaptureOptions::save_activations = true (the default)");
  }
  // A trace read from a file gives back each value's pages once it is looked at.
  ReleaseAfterLastUse pages(trace.ops().size(), [&trace](size_t i, const TensorVisitor& visit) {
    const Op& op = trace.ops()[i];
    if (op.is_output()) return;
    visit(op.out);
    for (const at::Tensor& t : op.outs) visit(t);
  });
  for (size_t i = 0; i < trace.ops().size(); ++i) {
    const Op& op = trace.ops()[i];
    if (op.is_output()) continue;  // an output holds its parent's value
    const Finiteness finiteness = OfOutputs(op);
    pages.Done(i);
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

absl::StatusOr<std::optional<NonFiniteGradient>> FirstNonFiniteGradient(const Trace& trace) {
  if (!trace.records_gradients()) {
    return absl::FailedPreconditionError(
        "the trace holds no gradients to look for NaN in: capture with "
        "CaptureOptions::save_grads = true (--backward), then run backward() from its outputs");
  }
  // Nodes and parameters in the order their gradients were complete.
  std::vector<std::pair<std::string, bool>> order;  // (label or address, is a parameter)
  absl::flat_hash_set<std::string> seen;
  for (const Op* backward : trace.backward_ops()) {
    const bool param = !backward->address.empty();
    const std::string& name = param ? backward->address : backward->forward_label;
    if (!name.empty() && seen.insert(absl::StrCat(param ? "p:" : "n:", name)).second) {
      order.emplace_back(name, param);
    }
  }
  for (auto op = trace.ops().rbegin(); op != trace.ops().rend(); ++op) {
    if (op->grad.defined() && !seen.contains(absl::StrCat("n:", op->label))) {
      order.emplace_back(op->label, false);
    }
  }
  for (const auto& [address, grad] : trace.param_grads()) {
    if (!seen.contains(absl::StrCat("p:", address))) order.emplace_back(address, true);
  }
  auto first_backward_op = [&](const std::string& name, bool param) {
    for (const Op* backward : trace.backward_ops()) {
      if (param ? backward->address == name
                : backward->address.empty() && backward->forward_label == name) {
        return backward->label;
      }
    }
    return std::string();
  };
  for (const auto& [name, param] : order) {
    Finiteness finiteness;
    NonFiniteGradient found;
    if (param) {
      auto it = trace.param_grads().find(name);
      if (it == trace.param_grads().end()) continue;
      finiteness = Of(it->second);
      if (!finiteness.nan && !finiteness.inf) continue;
      auto module = trace.params().find(name);
      if (module != trace.params().end()) found.module_address = module->second.module_address;
      for (const Op& op : trace.ops()) {
        if (std::find(op.parent_params.begin(), op.parent_params.end(), name) ==
            op.parent_params.end()) {
          continue;
        }
        const Finiteness of_reader = OfGrads(op);
        found.readers.emplace_back(op.label, !of_reader.nan && !of_reader.inf);
      }
    } else {
      const int index = trace.IndexOfLabel(name);
      if (index < 0) continue;
      const Op& op = trace.ops()[index];
      finiteness = OfGrads(op);
      if (!finiteness.nan && !finiteness.inf) continue;
      found.module_address = op.module_address;
      for (const int32_t child : op.child_indices) {
        const Op& reader = trace.ops()[child];
        const Finiteness of_reader = OfGrads(reader);
        found.readers.emplace_back(reader.label, !of_reader.nan && !of_reader.inf);
      }
    }
    found.label = name;
    found.is_param = param;
    found.has_nan = finiteness.nan;
    found.has_inf = finiteness.inf;
    found.backward_op = first_backward_op(name, param);
    return found;
  }
  return std::optional<NonFiniteGradient>();
}

}  // namespace torchlens
