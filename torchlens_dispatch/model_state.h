// A model's registered state as the capture sees it: parameters, buffers and modules,
// addressed exactly as `named_parameters()`, `named_buffers()` and `named_modules()` name
// them. Read once when a capture starts, from either model kind (jit_model.h, nn_model.h).
#ifndef TORCHLENS_DISPATCH_MODEL_STATE_H_
#define TORCHLENS_DISPATCH_MODEL_STATE_H_

#include <cstddef>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

namespace torchlens {

struct ModuleHandle {
  std::string address;  // "" for the root
  std::string type_name;
};

struct ParamHandle {
  std::string address;
  std::string module_address;
  at::Tensor tensor;
};

struct BufferHandle {
  std::string address;
  std::string module_address;
  at::Tensor tensor;  // the registered tensor when capture started
  // TorchScript only: the object whose attribute slot holds the buffer, so that a
  // reassignment (`self.h = t`, a prim::SetAttr that no dispatched op reveals) can be seen
  // by reading the slot. Null for torch::nn modules, whose buffers cannot be reassigned.
  c10::intrusive_ptr<c10::ivalue::Object> owner;
  size_t slot = 0;
  // TorchScript code contains a prim::SetAttr that may replace this buffer.
  bool assigned_in_code = false;

  // The tensor registered now (undefined if the slot holds None).
  const c10::TensorImpl* CurrentImpl() const;
  at::Tensor Current() const;
};

struct ModelState {
  bool torchscript = false;
  bool training = false;
  std::vector<ModuleHandle> modules;
  std::vector<ParamHandle> params;
  std::vector<BufferHandle> buffers;
};

// "Linear" from "__torch__.torch.nn.modules.linear.Linear" or "torch::nn::LinearImpl".
std::string ShortTypeName(const std::string& qualified);

}  // namespace torchlens

#endif  // TORCHLENS_DISPATCH_MODEL_STATE_H_
