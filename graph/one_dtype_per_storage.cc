#include "graph/one_dtype_per_storage.h"

#include <ATen/core/Dict.h>
#include <ATen/core/List.h>
#include <ATen/core/Tensor.h>

#include <utility>
#include <vector>

namespace torchlens {

using Dict = c10::impl::GenericDict;

std::optional<c10::IValue> OneDtypePerStorage::Separate(const c10::IValue& value) {
  if (value.isTensor()) {
    const at::Tensor& t = value.toTensor();
    if (!t.defined() || !t.has_storage()) return std::nullopt;
    if (t.is_conj() || t.is_neg()) {
      at::Tensor resolved = t.resolve_conj().resolve_neg();
      dtypes_.emplace(resolved.storage().unsafeGetStorageImpl(), resolved.scalar_type());
      return c10::IValue(std::move(resolved));
    }
    auto [it, first] = dtypes_.emplace(t.storage().unsafeGetStorageImpl(), t.scalar_type());
    if (first || it->second == t.scalar_type()) return std::nullopt;
    at::Tensor copy = t.clone();
    dtypes_.emplace(copy.storage().unsafeGetStorageImpl(), copy.scalar_type());
    return c10::IValue(std::move(copy));
  }
  if (value.isList()) {
    c10::List<c10::IValue> list = value.toList();
    std::optional<c10::List<c10::IValue>> copy;
    for (size_t i = 0; i < list.size(); ++i) {
      std::optional<c10::IValue> element = Separate(list.get(i));
      if (!element.has_value()) continue;
      if (!copy.has_value()) copy = list.copy();
      copy->set(i, *std::move(element));
    }
    return copy.has_value() ? std::optional<c10::IValue>(c10::IValue(*copy)) : std::nullopt;
  }
  if (value.isTuple()) {
    const auto& elements = value.toTupleRef().elements();
    std::vector<c10::IValue> copy;
    for (size_t i = 0; i < elements.size(); ++i) {
      std::optional<c10::IValue> element = Separate(elements[i]);
      if (!element.has_value()) continue;
      if (copy.empty()) copy.assign(elements.begin(), elements.end());
      copy[i] = *std::move(element);
    }
    if (copy.empty()) return std::nullopt;
    return c10::IValue(c10::ivalue::Tuple::create(std::move(copy)));
  }
  if (value.isGenericDict()) {
    Dict dict = value.toGenericDict();
    std::optional<Dict> copy;
    for (const auto& entry : dict) {
      std::optional<c10::IValue> element = Separate(entry.value());
      if (!element.has_value()) continue;
      if (!copy.has_value()) copy = dict.copy();
      copy->insert_or_assign(entry.key(), *std::move(element));
    }
    return copy.has_value() ? std::optional<c10::IValue>(c10::IValue(*copy)) : std::nullopt;
  }
  return std::nullopt;
}

}  // namespace torchlens
