// Visiting and replacing the tensors inside an op's arguments or returns.
//
// An op argument holds tensors directly (`Tensor`, `Tensor?`), in lists (`Tensor[]` of
// `aten::cat`, `Tensor?[]` of `aten::index`) or, rarely, in tuples and dicts (the values,
// in insertion order: segmentation models return {"out": ...}). Capture records one
// source per tensor in the order `ForEachTensor` visits them, and replay rebuilds the
// arguments with `MapTensors` in the same order, so the two must agree: both walk
// depth-first, left to right, and both skip `None` list elements.
#ifndef TORCHLENS_DISPATCH_OPS_IVALUE_TENSORS_H_
#define TORCHLENS_DISPATCH_OPS_IVALUE_TENSORS_H_

#include <ATen/core/ivalue.h>

#include "absl/functional/function_ref.h"

namespace torchlens {

// Calls `visit(const at::Tensor&)` for each tensor inside `value` (including undefined
// tensors held directly).
template <typename Visit>
void ForEachTensor(const c10::IValue& value, Visit&& visit) {
  if (value.isTensor()) {
    visit(value.toTensor());
  } else if (value.isList()) {
    for (const c10::IValue& element : value.toListRef()) ForEachTensor(element, visit);
  } else if (value.isTuple()) {
    for (const c10::IValue& element : value.toTupleRef().elements()) {
      ForEachTensor(element, visit);
    }
  } else if (value.isGenericDict()) {
    for (const auto& entry : value.toGenericDict()) ForEachTensor(entry.value(), visit);
  }
}

// Whether `value` holds any tensor (so that `MapTensors` must rebuild it).
bool ContainsTensor(const c10::IValue& value);

// A copy of `value` whose tensors are replaced, in `ForEachTensor` order, by
// `replace(const at::Tensor&) -> at::Tensor`. Containers without tensors are shared.
c10::IValue MapTensors(const c10::IValue& value,
                       absl::FunctionRef<at::Tensor(const at::Tensor&)> replace);

}  // namespace torchlens

#endif  // TORCHLENS_DISPATCH_OPS_IVALUE_TENSORS_H_
