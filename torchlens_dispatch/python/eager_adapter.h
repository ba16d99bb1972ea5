// The eager model adapter: what the Python front-end does to a Python `nn.Module` so that
// the capture engine (eager_model.h, eager_scope.h) sees it as it sees TorchScript and
// torch::nn models. Everything here runs with the GIL held, once per capture or once per
// module call; nothing runs per op.
//
// NOTE [Eager module scopes]
// The dispatcher does not know which module's forward is running. While capturing, the
// `forward` of each class of the model's modules is replaced by a `ScopedForward`, a C-level
// descriptor that binds to the instance as a function does and calls the class's own
// forward inside an `EagerModuleScope` of that instance: `nn.Module.__call__`, hooks and
// `super().forward` run as before, and no Python code is added to a module call (a Python
// forward hook costs a module call several microseconds). Patching classes, not instances,
// costs a capture one attribute per class and leaves the instances' dicts alone (NOTE
// [Eager readings reused]). Instances of those classes outside the model, and other
// threads, pass through: the scope opens only for a module of the model this thread
// captures. A module holding a `forward` of its own in its `__dict__` gets it wrapped
// there instead. The patches are counted per class and per instance (captures on two
// threads share them) and removed when the last capture ends, also when the forward
// raised. TorchScript submodules keep their compiled forward (their ops belong to the
// eager module that calls them).
//
// NOTE [Eager readings reused]
// Reading a model (walking its modules' dicts, building addresses and the layout) costs a
// small model more than capturing its forward, so a reading is kept while its root module
// lives and reused while nothing in the model changed. Every mutation of a Python dict
// gives it a new version tag (PEP 509), so a reading records, for each module in pre-order,
// the tags of its `__dict__` and of its `_parameters`, `_buffers` and `_modules`, and is
// valid while all are unchanged: a parent is checked before its children, so a child
// replaced or removed is never dereferenced. Each parameter's storage is checked too,
// since `p.data = t` changes no dict. A buffer reassigned by the forward changes
// `_buffers`, so the next capture reads the model anew, which it must (the layout holds
// the buffers' tensors).
#ifndef TORCHLENS_DISPATCH_PYTHON_EAGER_ADAPTER_H_
#define TORCHLENS_DISPATCH_PYTHON_EAGER_ADAPTER_H_

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "torchlens_dispatch/eager_model.h"

namespace torchlens {
namespace python {

// A model as the capture needs it. The pointers are borrowed: the root keeps its modules
// alive while the reading is valid (NOTE [Eager readings reused]).
struct EagerReading {
  EagerModel model;                                        // its `layout` filled in
  std::vector<PyObject*> modules;                          // pre-order, the root first
  std::vector<std::pair<PyObject*, std::string>> buffers;  // (owning module, name)
  // NOTE [Eager module scopes]: the classes whose forward is scoped, and the modules
  // holding a forward of their own.
  std::vector<PyTypeObject*> scoped_classes;
  std::vector<PyObject*> own_forwards;
  pybind11::tuple buffer_classes;  // the classes of the modules that own buffers

  struct ModuleCheck {
    PyObject* module;
    PyTypeObject* type;
    PyObject* dict;        // its __dict__
    PyObject* members[3];  // _parameters, _buffers, _modules
    uint64_t tags[4];      // __dict__'s, then the members'
  };
  std::vector<ModuleCheck> checks;  // empty: the model cannot be checked, read it anew
  struct ParamCheck {
    const c10::TensorImpl* tensor;
    const c10::StorageImpl* storage;
    int64_t offset;
    int64_t numel;
  };
  std::vector<ParamCheck> param_checks;
};

// The reading of `model`: the one kept from an earlier capture when nothing changed since,
// otherwise read anew as `named_modules()`, `named_parameters()` and `named_buffers()` list
// it (shared modules and tensors once, under their first address). Modules that are
// instances of `script_module_type` get no scope. Throws pybind11::error_already_set on a
// Python error.
std::shared_ptr<EagerReading> ReadEagerModel(pybind11::handle model,
                                             pybind11::handle script_module_type);

// NOTE [Eager module scopes]: installs and removes the scoped forwards. Close never raises.
void OpenModuleScopes(const EagerReading& reading);
void CloseModuleScopes(const EagerReading& reading);

// Registers the ScopedForward type; called once from the module's initialisation.
bool InitScopedForwardType();

}  // namespace python
}  // namespace torchlens

#endif  // TORCHLENS_DISPATCH_PYTHON_EAGER_ADAPTER_H_
