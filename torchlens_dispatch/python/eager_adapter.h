// The eager model adapter: what the Python front-end does to a Python `nn.Module` so that
// the capture engine (eager_model.h, eager_scope.h) sees it as it sees TorchScript and
// torch::nn models. Everything here runs with the GIL held, once per capture or once per
// module call; nothing runs per op.
//
// NOTE [Eager module scopes]
// The dispatcher does not know which module's forward is running. While capturing, each
// module of the model gets an instance attribute `forward` (a `ScopedForward`) that opens
// an `EagerModuleScope` around a call of the module's own forward: `nn.Module.__call__`
// looks `self.forward` up on the instance first, so hooks and `__call__` run as before and
// no Python code is added to the module call. A C-level callable costs a module call well
// under a microsecond, where a Python forward hook costs several. The attributes are
// installed with a count per module (two threads capturing one model share them) and
// removed when the last capture ends, also when the forward raised; a `forward` the
// instance had of its own is put back. TorchScript submodules keep their compiled forward
// (their ops belong to the eager module that calls them).
#ifndef TORCHLENS_DISPATCH_PYTHON_EAGER_ADAPTER_H_
#define TORCHLENS_DISPATCH_PYTHON_EAGER_ADAPTER_H_

#include <pybind11/pybind11.h>

#include <vector>

#include "torchlens_dispatch/eager_model.h"

namespace torchlens {
namespace python {

// Reads `model` as `named_modules()`, `named_parameters()` and `named_buffers()` list it
// (shared modules and tensors once, under their first address), with the module objects
// in the same order. Throws pybind11::error_already_set on a Python error.
EagerModel ReadEagerModel(pybind11::handle model, std::vector<pybind11::object>* modules);

// NOTE [Eager module scopes]: installs the scoped forwards on `modules` (skipping
// TorchScript modules, which are instances of `script_module_type`).
void OpenModuleScopes(const std::vector<pybind11::object>& modules,
                      pybind11::handle script_module_type);
// Removes what OpenModuleScopes installed on the same modules. Never raises.
void CloseModuleScopes(const std::vector<pybind11::object>& modules);

// Registers the ScopedForward type; called once from the module's initialisation.
bool InitScopedForwardType();

}  // namespace python
}  // namespace torchlens

#endif  // TORCHLENS_DISPATCH_PYTHON_EAGER_ADAPTER_H_
