// libFuzzer target: reading torch.save files (--input). Any bytes give values or an error
// status, and every tensor of the values reads only its own storage (ASan watches).
#include <ATen/ATen.h>

#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "graph/torch_load.h"

namespace {

// Reads the tensor's elements through its sizes, strides and offset: all of them when
// there are few, else the first and the last (a stride-0 tensor may claim 2^62).
void Touch(const at::Tensor& tensor) {
  if (tensor.numel() == 0) return;
  if (tensor.numel() <= (int64_t{1} << 16)) {
    (void)tensor.clone();
    return;
  }
  for (bool last : {false, true}) {
    at::Tensor element = tensor;
    while (element.dim() > 0) element = element.select(0, last ? element.size(0) - 1 : 0);
    (void)element.clone();
  }
}

void TouchAll(const c10::IValue& value) {
  if (value.isTensor()) {
    Touch(value.toTensor());
  } else if (value.isList()) {
    for (const c10::IValue& element : value.toListRef()) TouchAll(element);
  } else if (value.isTuple()) {
    for (const c10::IValue& element : value.toTupleRef().elements()) TouchAll(element);
  } else if (value.isGenericDict()) {
    for (const auto& entry : value.toGenericDict()) {
      TouchAll(entry.key());
      TouchAll(entry.value());
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<c10::IValue> value = torchlens::LoadPickled(bytes);
  if (value.ok()) TouchAll(*value);
  return 0;
}
