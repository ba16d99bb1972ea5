// An eager PyTorch model (a Python `nn.Module`) as the capture sees it, described by the
// Python front-end (torchlens_dispatch/python/) without any Python type: the engine
// below it is the same for TorchScript, torch::nn and eager models.
//
// The front-end walks the model as `named_modules()`, `named_parameters()` and
// `named_buffers()` do and fills an `EagerModel`; `CaptureGuard(const EagerModel&)`
// (capture.h) captures against it. During the forward the front-end reports two things
// the dispatcher cannot see: which module's call is open (`EagerModuleScope`, from the
// module's `forward`), and reassignments of a buffer slot (`ReportBufferAssigned`, from
// the module's `__setattr__`).
//
//   EagerModel model;
//   model.modules.push_back({"", "Net", root_identity});
//   model.buffers.push_back({"h", h_tensor});
//   CaptureGuard guard(model);
//   { EagerModuleScope scope(root_identity); ... run the forward ... }
//   absl::StatusOr<Trace> trace = guard.Finish(outputs);
#ifndef TORCHLENS_DISPATCH_EAGER_MODEL_H_
#define TORCHLENS_DISPATCH_EAGER_MODEL_H_

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "torchlens_dispatch/model_layout.h"

namespace torchlens {

struct EagerModel {
  struct Module {
    std::string address;    // "" for the root, "layer1.0.conv1"
    std::string type_name;  // "Conv2d"
    const void* identity;   // the module object; only compared, never dereferenced
  };
  struct Tensor {
    std::string address;  // "layer1.0.bn1.running_mean"
    at::Tensor tensor;
  };
  struct Buffer {
    std::string address;  // "layer1.0.bn1.running_mean"
    at::Tensor tensor;
    const void* owner;  // identity of the module that registered it
    std::string name;   // its name there: "running_mean"
  };
  std::vector<Module> modules;  // the root first, then as named_modules() lists them
  std::vector<Tensor> params;   // as named_parameters() lists them
  std::vector<Buffer> buffers;  // as named_buffers() lists them
  // Tensors held as plain attributes (neither parameters nor buffers): a read of one is a
  // constant named by its address (NOTE [Constants] in recorder.h).
  std::vector<Tensor> tensor_attributes;
  bool training = false;  // the root's `training` flag
  // LayoutOf(*this), when the front-end kept it from an earlier capture of the unchanged
  // model; null: CaptureGuard reads it.
  std::shared_ptr<const ModelLayout> layout;
};

// The layout of `model`: read anew for every capture, as for torch::nn modules.
std::shared_ptr<const ModelLayout> LayoutOf(const EagerModel& model);

}  // namespace torchlens

#endif  // TORCHLENS_DISPATCH_EAGER_MODEL_H_
