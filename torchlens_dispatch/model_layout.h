// A model's registered structure as the capture sees it: modules, parameters and buffers,
// addressed exactly as `named_modules()`, `named_parameters()` and `named_buffers()` name
// them.
//
// NOTE [Model layouts]
// Reading a model's structure costs string building per module and parameter, which on a
// model of thousands of layers is more than the capture of its ops. A layout is therefore
// read once and shared: every capture of the same TorchScript model reuses it, after
// checking in one pass without allocation that the object tree still has the same modules
// of the same types holding the same parameter tensors (otherwise it is read again). The
// trace metadata derived from it (the `modules()` and `params()` maps) is built once and
// shared by every trace of the model. Buffers are not cached by value: each capture reads
// the tensors the buffer slots hold now. torch::nn modules are read on every capture.
// What a layout says about the model never changes once read; two members are caches the
// captures of the model fill as they run, and are `mutable` for that reason: the sizes of
// the last capture (hints, relaxed atomics) and the table of numbered layers (which
// guards itself, NOTE [Layer classes]).
#ifndef TORCHLENS_DISPATCH_MODEL_LAYOUT_H_
#define TORCHLENS_DISPATCH_MODEL_LAYOUT_H_

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "graph/trace.h"
#include "torchlens_dispatch/layer_classes.h"
#include "torchlens_dispatch/module_fwd.h"

namespace torchlens {

struct ModelLayout {
  bool torchscript = false;
  // An eager PyTorch model, read by the Python front-end (eager_model.h): ops run in the
  // module whose call is open (Recorder::EnterModule), and the front-end reports buffer
  // reassignments (Recorder::OnBufferAssigned).
  bool eager = false;
  uint32_t serial = 0;  // distinct for every layout built (FinishLayout numbers them)

  // Module ids index these; 0 is the root "".
  std::shared_ptr<const std::vector<std::string>> module_addresses;
  absl::flat_hash_map<std::string, int32_t> module_ids;
  std::vector<std::string> module_types;              // by id: "Linear", "ModuleList"
  std::vector<std::vector<int32_t>> module_children;  // by id: direct submodules

  struct ParamEntry {
    std::string address;
    int32_t module = 0;
    at::Tensor tensor;
    at::Tensor saved;  // what traces keep: detached when the parameter requires grad
  };
  std::vector<ParamEntry> params;
  // By parameter id, each entry's `saved`: the values a saving capture's parameter
  // arguments hold by reference (NOTE [Parameters read by reference] in parameter_state.h).
  std::vector<at::Tensor> param_values;
  // The parameters whose `saved` lives in each storage, and whether every parameter's
  // `saved` is a detached alias, which makes a storage with one holder no parameter's.
  absl::flat_hash_map<const c10::StorageImpl*, absl::InlinedVector<int32_t, 1>> param_storages;
  bool params_detached = true;
  // Some parameter shares its storage with a registered buffer when the model was laid
  // out (`register_buffer("b", weight.detach())`): only then do parameters need a look
  // at the buffers when first read (Recorder::AddUnseen).
  bool params_share_buffer_storage = false;
  std::shared_ptr<const std::vector<std::string>> param_addresses;
  absl::flat_hash_map<const c10::TensorImpl*, int32_t> param_ids;
  // The parameters in registration order, each with its id in `param_ids` (the first of
  // its addresses). Forward passes mostly read parameters in this order, so the recorder
  // tries the one after the last it found before it hashes: on a model larger than the
  // cache the hash probe is a miss per parameter.
  std::vector<std::pair<const c10::TensorImpl*, int32_t>> param_order;
  // The module of each parameter, by id: what the recorder reads per parameter, packed
  // sixteen to a cache line rather than one per `ParamEntry`.
  std::vector<int32_t> param_modules;

  struct BufferEntry {
    std::string address;
    int32_t module = 0;
    // TorchScript: the object whose attribute slot holds the buffer (valid while the model
    // lives), so that reassignments (`self.h = t`) can be seen by reading the slot.
    c10::ivalue::Object* owner = nullptr;
    size_t slot = 0;
    bool assigned_in_code = false;  // some method's code has a prim::SetAttr for it
    // torch::nn: the registered tensor (never reassigned). Eager: the registered tensor
    // when the capture started; the journal follows reassignments the front-end reports.
    at::Tensor tensor;
  };
  std::vector<BufferEntry> buffers;

  // TorchScript: tensor attributes that are neither parameters nor buffers (`self.scale =
  // torch.tensor(...)`), read when a capture starts to name the constants that hold them
  // (NOTE [Constants] in recorder.h).
  struct AttributeEntry {
    std::string address;
    c10::ivalue::Object* owner = nullptr;  // valid while the model lives
    size_t slot = 0;
    at::Tensor tensor;  // eager models: the attribute's tensor (owner is null)
  };
  std::vector<AttributeEntry> tensor_attributes;

  // Eager models: the module objects (opaque identities given by the front-end) by id, so
  // that a module call names its module (Recorder::EnterModule).
  absl::flat_hash_map<const void*, int32_t> eager_module_ids;
  // And each buffer by (its module's identity, its name there), for reassignments.
  absl::flat_hash_map<std::pair<const void*, std::string>, int32_t> eager_buffer_ids;

  // Trace metadata, shared by every trace of the model.
  std::shared_ptr<const std::map<std::string, Module>> trace_modules;
  std::shared_ptr<const std::map<std::string, Param>> trace_params;

  // TorchScript: what the layout was read from, checked before reuse. In walk order
  // (pre-order), each object's slot count, then the identity of the value each of its
  // module and parameter slots held: an object is checked only after the slot of its
  // parent that leads to it, so a replaced submodule is never dereferenced.
  struct SlotCheck {
    const c10::ivalue::Object* object;
    size_t slot;           // SIZE_MAX: check the object's slot count instead
    const void* expected;  // the child object or parameter TensorImpl; the slot count
  };
  std::vector<SlotCheck> checks;

  // How large the last capture of this model grew: the next one reserves as much, so its
  // tables and record vectors do not rehash and reallocate as they fill, which on models of
  // thousands of layers is a large share of a capture. Hints only: relaxed atomics,
  // shared by threads capturing the same model.
  struct CaptureSizes {
    std::atomic<uint32_t> tensors{0};
    std::atomic<uint32_t> storages{0};
    std::atomic<uint32_t> layers{0};
    std::atomic<uint32_t> layer_classes{0};
    std::atomic<uint32_t> nodes{0};
    std::atomic<uint32_t> args{0};
    std::atomic<uint32_t> sources{0};
    std::atomic<uint32_t> outputs{0};
    std::atomic<uint32_t> shapes{0};
    std::atomic<uint32_t> slots{0};
  };
  mutable CaptureSizes last_capture_sizes;

  // The numbered layers of the model's TorchScript code: NOTE [Layer classes].
  mutable LayerClasses layer_classes;

  // TorchScript: where the model's code first forks work onto another thread ("Net.forward
  // forks at code/__torch__.py:9: ..."), or empty. Such models are not captured: NOTE
  // [Forked work] in jit_layout.cc.
  std::string forked_work;
};

// The tensor a buffer entry's slot holds now (undefined if the slot holds None).
at::Tensor CurrentBuffer(const ModelLayout::BufferEntry& buffer);
// Its TensorImpl, without taking a reference (null for None): for the check before every op
// (NOTE [Buffer reassignment] in recorder.h).
inline const c10::TensorImpl* CurrentBufferImpl(const ModelLayout::BufferEntry& buffer) {
  if (buffer.owner == nullptr) {
    return buffer.tensor.defined() ? buffer.tensor.unsafeGetTensorImpl() : nullptr;
  }
  const c10::IValue& value = buffer.owner->getSlot(buffer.slot);
  return value.isTensor() ? value.unsafeToTensorImpl() : nullptr;
}

// The layout of `model`, from the cache when the model is unchanged (see the NOTE).
std::shared_ptr<const ModelLayout> LayoutOf(const torch::jit::Module& model);
std::shared_ptr<const ModelLayout> LayoutOf(const torch::nn::Module& model);

// "Linear" from "__torch__.torch.nn.modules.linear.Linear" or "torch::nn::LinearImpl".
std::string ShortTypeName(const std::string& qualified);

}  // namespace torchlens

#endif  // TORCHLENS_DISPATCH_MODEL_LAYOUT_H_
