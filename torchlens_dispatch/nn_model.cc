#include "torchlens_dispatch/nn_model.h"

#include <string>

#include <torch/nn/module.h>

namespace torchlens {
namespace {

std::string OwnerAddress(const std::string& address) {
  const size_t dot = address.rfind('.');
  return dot == std::string::npos ? std::string() : address.substr(0, dot);
}

}  // namespace

ModelState ReadModelState(const torch::nn::Module& model) {
  ModelState state;
  state.torchscript = false;
  state.training = model.is_training();
  // include_self = false: the root may live on the stack rather than in a shared_ptr.
  state.modules.push_back(ModuleHandle{"", ShortTypeName(model.name())});
  for (const auto& named : model.named_modules("", /*include_self=*/false)) {
    state.modules.push_back(ModuleHandle{named.key(), ShortTypeName(named.value()->name())});
  }
  for (const auto& named : model.named_parameters(/*recurse=*/true)) {
    state.params.push_back(ParamHandle{named.key(), OwnerAddress(named.key()), named.value()});
  }
  for (const auto& named : model.named_buffers(/*recurse=*/true)) {
    BufferHandle buffer;
    buffer.address = named.key();
    buffer.module_address = OwnerAddress(named.key());
    buffer.tensor = named.value();
    state.buffers.push_back(std::move(buffer));
  }
  return state;
}

}  // namespace torchlens
