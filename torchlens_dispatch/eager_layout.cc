// ModelLayout of eager PyTorch models (eager_model.h), read on every capture.
#include <memory>
#include <string>
#include <utility>

#include "torchlens_dispatch/eager_model.h"
#include "torchlens_dispatch/layout_builder.h"
#include "torchlens_dispatch/model_layout.h"

namespace torchlens {

std::shared_ptr<const ModelLayout> LayoutOf(const EagerModel& model) {
  auto layout = std::make_shared<ModelLayout>();
  layout->eager = true;
  std::vector<std::pair<std::string, std::string>> modules;
  modules.reserve(model.modules.size());
  for (const EagerModel::Module& module : model.modules) {
    modules.emplace_back(module.address, module.type_name);
  }
  for (const EagerModel::Tensor& param : model.params) {
    layout->params.push_back(ModelLayout::ParamEntry{param.address, 0, param.tensor, at::Tensor()});
  }
  for (const EagerModel::Buffer& named : model.buffers) {
    ModelLayout::BufferEntry buffer;
    buffer.address = named.address;
    buffer.tensor = named.tensor;
    layout->eager_buffer_ids.emplace(std::make_pair(named.owner, named.name),
                                     static_cast<int32_t>(layout->buffers.size()));
    layout->buffers.push_back(std::move(buffer));
  }
  for (const EagerModel::Tensor& attribute : model.tensor_attributes) {
    ModelLayout::AttributeEntry entry;
    entry.address = attribute.address;
    entry.tensor = attribute.tensor;
    layout->tensor_attributes.push_back(std::move(entry));
  }
  FinishLayout(std::move(modules), layout.get());
  for (const EagerModel::Module& module : model.modules) {
    auto id = layout->module_ids.find(module.address);
    if (id != layout->module_ids.end())
      layout->eager_module_ids.emplace(module.identity, id->second);
  }
  return layout;
}

}  // namespace torchlens
