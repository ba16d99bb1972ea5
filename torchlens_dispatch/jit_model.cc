#include "torchlens_dispatch/jit_model.h"

#include <map>
#include <string>
#include <utility>

#include <torch/script.h>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace torchlens {
namespace {

// (class type, attribute name) pairs assigned by prim::SetAttr anywhere in `block`.
void CollectSetAttrs(const torch::jit::Block* block,
                     absl::flat_hash_set<std::pair<const c10::ClassType*, std::string>>* out) {
  for (const torch::jit::Node* node : block->nodes()) {
    if (node->kind() == c10::prim::SetAttr) {
      if (auto type = node->input(0)->type()->cast<c10::ClassType>()) {
        out->emplace(type.get(), node->s(c10::attr::name));
      }
    }
    for (const torch::jit::Block* inner : node->blocks()) CollectSetAttrs(inner, out);
  }
}

std::string OwnerAddress(const std::string& address) {
  const size_t dot = address.rfind('.');
  return dot == std::string::npos ? std::string() : address.substr(0, dot);
}

std::string AttributeName(const std::string& address) {
  const size_t dot = address.rfind('.');
  return dot == std::string::npos ? address : address.substr(dot + 1);
}

}  // namespace

ModelState ReadModelState(const torch::jit::Module& model) {
  ModelState state;
  state.torchscript = true;
  state.training = model.is_training();

  absl::flat_hash_set<std::pair<const c10::ClassType*, std::string>> assigned;
  std::map<std::string, torch::jit::Module> modules_by_address;
  for (const torch::jit::NameModule& named : model.named_modules()) {
    const c10::ClassTypePtr type = named.value.type();
    state.modules.push_back(
        ModuleHandle{named.name, ShortTypeName(type->name() ? type->name()->qualifiedName()
                                                            : std::string("Module"))});
    modules_by_address.emplace(named.name, named.value);
    for (const torch::jit::Method& method : named.value.get_methods()) {
      CollectSetAttrs(method.graph()->block(), &assigned);
    }
  }
  for (const torch::jit::NameTensor& named : model.named_parameters(/*recurse=*/true)) {
    state.params.push_back(ParamHandle{named.name, OwnerAddress(named.name), named.value});
  }
  for (const torch::jit::NameTensor& named : model.named_buffers(/*recurse=*/true)) {
    BufferHandle buffer;
    buffer.address = named.name;
    buffer.module_address = OwnerAddress(named.name);
    buffer.tensor = named.value;
    auto owner = modules_by_address.find(buffer.module_address);
    if (owner != modules_by_address.end()) {
      buffer.owner = owner->second._ivalue();
      const std::string attribute = AttributeName(named.name);
      buffer.slot = buffer.owner->type()->getAttributeSlot(attribute);
      buffer.assigned_in_code = assigned.contains({buffer.owner->type().get(), attribute});
    }
    state.buffers.push_back(std::move(buffer));
  }
  return state;
}

}  // namespace torchlens
