#include "torchlens_dispatch/model_state.h"

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"

namespace torchlens {

const c10::TensorImpl* BufferHandle::CurrentImpl() const {
  if (!owner) return tensor.unsafeGetTensorImpl();
  const c10::IValue& value = owner->getSlot(slot);
  return value.isTensor() ? value.unsafeToTensorImpl() : nullptr;
}

at::Tensor BufferHandle::Current() const {
  if (!owner) return tensor;
  const c10::IValue& value = owner->getSlot(slot);
  return value.isTensor() ? value.toTensor() : at::Tensor();
}

std::string ShortTypeName(const std::string& qualified) {
  absl::string_view name = qualified;
  for (absl::string_view separator : {"::", "."}) {
    if (const size_t at = name.rfind(separator); at != absl::string_view::npos) {
      name = name.substr(at + separator.size());
    }
  }
  if (absl::EndsWith(name, "Impl") && name.size() > 4) name.remove_suffix(4);
  return std::string(name);
}

}  // namespace torchlens
