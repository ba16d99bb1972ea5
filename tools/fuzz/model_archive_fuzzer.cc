// libFuzzer target: loading TorchScript model archives. Any bytes give a module or an
// error status: the archive checks run before LibTorch reads anything.
#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "torchlens_dispatch/load_model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<torch::jit::Module> model = torchlens::LoadTorchScriptFromBytes(bytes);
  if (model.ok()) {
    // Every parameter and buffer was checked against its record: read them all.
    for (const torch::jit::NameTensor& tensor : model->named_parameters()) {
      (void)tensor.value.clone();
    }
    for (const torch::jit::NameTensor& tensor : model->named_buffers()) {
      (void)tensor.value.clone();
    }
  }
  return 0;
}
