#include "torchlens_dispatch/ops/ivalue_tensors.h"

#include <vector>

namespace torchlens {

bool ContainsTensor(const c10::IValue& value) {
  bool found = false;
  ForEachTensor(value, [&](const at::Tensor&) { found = true; });
  return found;
}

c10::IValue MapTensors(const c10::IValue& value,
                       absl::FunctionRef<at::Tensor(const at::Tensor&)> replace) {
  if (value.isTensor()) return replace(value.toTensor());
  if (!ContainsTensor(value)) return value;
  if (value.isList()) {
    c10::List<c10::IValue> source = value.toList();
    c10::impl::GenericList mapped(source.elementType());
    mapped.reserve(source.size());
    for (const c10::IValue& element : value.toListRef()) {
      mapped.push_back(MapTensors(element, replace));
    }
    return c10::IValue(std::move(mapped));
  }
  if (value.isTuple()) {
    std::vector<c10::IValue> elements;
    for (const c10::IValue& element : value.toTupleRef().elements()) {
      elements.push_back(MapTensors(element, replace));
    }
    return c10::ivalue::Tuple::create(std::move(elements));
  }
  if (value.isGenericDict()) {
    const c10::impl::GenericDict source = value.toGenericDict();
    c10::impl::GenericDict mapped(source.keyType(), source.valueType());
    for (const auto& entry : source) mapped.insert(entry.key(), MapTensors(entry.value(), replace));
    return c10::IValue(std::move(mapped));
  }
  return value;
}

}  // namespace torchlens
