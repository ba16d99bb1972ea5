// ModelLayout of torch::nn (C++ frontend) modules, read on every capture.
#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <utility>

#include "torchlens_dispatch/layout_builder.h"
#include "torchlens_dispatch/model_layout.h"

namespace torchlens {

std::shared_ptr<const ModelLayout> LayoutOf(const torch::nn::Module& model) {
  auto layout = std::make_shared<ModelLayout>();
  layout->torchscript = false;
  std::vector<std::pair<std::string, std::string>> modules;
  // include_self = false: the root may live on the stack rather than in a shared_ptr.
  for (const auto& named : model.named_modules("", /*include_self=*/false)) {
    modules.emplace_back(named.key(), ShortTypeName(named.value()->name()));
  }
  modules.emplace(modules.begin(), "", ShortTypeName(model.name()));
  for (const auto& named : model.named_parameters(/*recurse=*/true)) {
    layout->params.push_back(ModelLayout::ParamEntry{named.key(), 0, named.value(), at::Tensor()});
  }
  for (const auto& named : model.named_buffers(/*recurse=*/true)) {
    ModelLayout::BufferEntry buffer;
    buffer.address = named.key();
    buffer.tensor = named.value();
    layout->buffers.push_back(std::move(buffer));
  }
  FinishLayout(std::move(modules), layout.get());
  return layout;
}

}  // namespace torchlens
