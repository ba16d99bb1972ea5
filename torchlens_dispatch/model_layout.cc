#include "torchlens_dispatch/model_layout.h"

#include <algorithm>
#include <atomic>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "torchlens_dispatch/layout_builder.h"

namespace torchlens {

at::Tensor CurrentBuffer(const ModelLayout::BufferEntry& buffer) {
  if (buffer.owner == nullptr) return buffer.tensor;
  const c10::IValue& value = buffer.owner->getSlot(buffer.slot);
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

std::string OwnerAddress(const std::string& address) {
  const size_t dot = address.rfind('.');
  return dot == std::string::npos ? std::string() : address.substr(0, dot);
}

void FinishLayout(std::vector<std::pair<std::string, std::string>> modules, ModelLayout* layout) {
  static std::atomic<uint32_t> layouts_built{0};
  layout->serial = ++layouts_built;
  auto addresses = std::make_shared<std::vector<std::string>>();
  auto trace_modules = std::make_shared<std::map<std::string, Module>>();
  addresses->push_back("");
  layout->module_ids.emplace("", 0);
  for (auto& [address, type_name] : modules) {
    if (layout->module_ids.emplace(address, static_cast<int32_t>(addresses->size())).second) {
      addresses->push_back(address);
    }
    // Walk order is mostly sorted order ("a", "a.b", "a.b.c"): the hint saves comparing
    // long shared prefixes down the tree.
    Module& module = trace_modules->emplace_hint(trace_modules->end(), address, Module())->second;
    module.address = address;
    module.type_name = std::move(type_name);
  }
  auto module_of = [&](const std::string& owner) -> int32_t {
    auto it = layout->module_ids.find(owner);
    if (it != layout->module_ids.end()) return it->second;
    const int32_t id = static_cast<int32_t>(addresses->size());
    addresses->push_back(owner);
    layout->module_ids.emplace(owner, id);
    return id;
  };
  // By module id, found once each: its trace Module (nullptr for an owner that is not a
  // module), and the id of the nearest module whose address is a dotted prefix of its own
  // (-1 for the root). A parameter then reaches its owners one step each, however deep it
  // sits, instead of looking up every prefix of its address.
  std::vector<Module*> trace_module_of;
  std::vector<int32_t> owner_of;
  auto describe = [&](int32_t id) {
    if (static_cast<size_t>(id) < trace_module_of.size() && owner_of[id] != -2) return;
    trace_module_of.resize(std::max(trace_module_of.size(), addresses->size()), nullptr);
    owner_of.resize(trace_module_of.size(), -2);
    const std::string& address = (*addresses)[id];
    auto it = trace_modules->find(address);
    trace_module_of[id] = it == trace_modules->end() ? nullptr : &it->second;
    owner_of[id] = -1;
    for (absl::string_view prefix = address; id != 0;) {
      const size_t dot = prefix.rfind('.');
      prefix = dot == absl::string_view::npos ? absl::string_view() : prefix.substr(0, dot);
      if (auto found = layout->module_ids.find(prefix); found != layout->module_ids.end()) {
        owner_of[id] = found->second;
        break;
      }
    }
  };
  // Every module whose address is a dotted prefix of `address`, the root included, owns it.
  auto add_to_owners = [&](const std::string& address, int32_t owner,
                           std::vector<std::string> Module::*member) {
    for (int32_t id = owner; id >= 0; id = owner_of[id]) {
      describe(id);
      if (trace_module_of[id] != nullptr) (trace_module_of[id]->*member).push_back(address);
    }
  };
  auto param_addresses = std::make_shared<std::vector<std::string>>();
  auto trace_params = std::make_shared<std::map<std::string, Param>>();
  for (size_t i = 0; i < layout->params.size(); ++i) {
    ModelLayout::ParamEntry& param = layout->params[i];
    const std::string owner = OwnerAddress(param.address);
    param.module = module_of(owner);
    param.saved = param.tensor.requires_grad() ? param.tensor.detach() : param.tensor;
    layout->param_values.push_back(param.saved);
    if (param.saved.unsafeGetTensorImpl() == param.tensor.unsafeGetTensorImpl()) {
      layout->params_detached = false;
    }
    if (param.saved.has_storage()) {
      layout->param_storages[param.saved.storage().unsafeGetStorageImpl()].push_back(
          static_cast<int32_t>(i));
    }
    layout->param_ids.emplace(param.tensor.unsafeGetTensorImpl(), static_cast<int32_t>(i));
    param_addresses->push_back(param.address);
    (*trace_params)[param.address] = Param{param.address, param.tensor.sizes().vec(), owner};
    add_to_owners(param.address, param.module, &Module::params);
  }
  layout->param_order.reserve(layout->params.size());
  for (const ModelLayout::ParamEntry& param : layout->params) {
    const c10::TensorImpl* impl = param.tensor.unsafeGetTensorImpl();
    layout->param_order.emplace_back(impl, layout->param_ids.at(impl));
    layout->param_modules.push_back(param.module);
  }
  absl::flat_hash_set<const c10::StorageImpl*> buffer_storages;
  for (ModelLayout::BufferEntry& buffer : layout->buffers) {
    buffer.module = module_of(OwnerAddress(buffer.address));
    add_to_owners(buffer.address, buffer.module, &Module::buffers);
    const at::Tensor tensor = CurrentBuffer(buffer);
    if (tensor.defined() && tensor.has_storage()) {
      buffer_storages.insert(tensor.storage().unsafeGetStorageImpl());
    }
  }
  for (const ModelLayout::ParamEntry& param : layout->params) {
    if (param.tensor.has_storage() &&
        buffer_storages.contains(param.tensor.storage().unsafeGetStorageImpl())) {
      layout->params_share_buffer_storage = true;
    }
  }
  layout->module_types.assign(addresses->size(), "");
  layout->module_children.assign(addresses->size(), {});
  for (const auto& [address, module] : *trace_modules) {
    const int32_t id = layout->module_ids.at(address);
    layout->module_types[id] = module.type_name;
    if (id != 0)
      layout->module_children[layout->module_ids.at(OwnerAddress(address))].push_back(id);
  }
  layout->module_addresses = std::move(addresses);
  layout->param_addresses = std::move(param_addresses);
  layout->trace_modules = std::move(trace_modules);
  layout->trace_params = std::move(trace_params);
}

}  // namespace torchlens
