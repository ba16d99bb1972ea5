#include "torchlens_dispatch/python/eager_adapter.h"

#include <Python.h>
#include <structmember.h>
#include <torch/csrc/autograd/python_variable.h>

#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "torchlens_dispatch/eager_scope.h"

namespace py = pybind11;

namespace torchlens {
namespace python {
namespace {

std::string Join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

// The items of a module's `_parameters`, `_buffers` or `_modules` dict (empty when the
// module has none, as a module whose __init__ never ran).
py::dict DictAttribute(py::handle module, const char* name) {
  py::object value = py::getattr(module, name, py::none());
  return py::isinstance<py::dict>(value) ? py::reinterpret_borrow<py::dict>(value) : py::dict();
}

struct Walk {
  EagerModel* model;
  std::vector<py::object>* modules;
  absl::flat_hash_set<PyObject*> seen_modules;
  absl::flat_hash_set<PyObject*> seen_tensors;

  void Visit(py::handle module, const std::string& address) {
    modules->push_back(py::reinterpret_borrow<py::object>(module));
    model->modules.push_back(EagerModel::Module{
        address, py::str(py::type::handle_of(module).attr("__name__")), module.ptr()});
    for (auto [name, value] : DictAttribute(module, "_parameters")) {
      if (!THPVariable_Check(value.ptr()) || !seen_tensors.insert(value.ptr()).second) continue;
      model->params.push_back(EagerModel::Tensor{Join(address, py::str(name)),
                                                 THPVariable_Unpack(value.ptr())});
    }
    for (auto [name, value] : DictAttribute(module, "_buffers")) {
      if (!THPVariable_Check(value.ptr()) || !seen_tensors.insert(value.ptr()).second) continue;
      const std::string key = py::str(name);
      model->buffers.push_back(EagerModel::Buffer{Join(address, key),
                                                  THPVariable_Unpack(value.ptr()), module.ptr(),
                                                  key});
    }
    // Plain tensor attributes (`self.scale = torch.tensor(2.0)`): constants named by their
    // address when read.
    if (PyObject** dict = _PyObject_GetDictPtr(module.ptr()); dict != nullptr && *dict != nullptr) {
      for (auto [name, value] : py::reinterpret_borrow<py::dict>(*dict)) {
        if (THPVariable_Check(value.ptr())) {
          model->tensor_attributes.push_back(EagerModel::Tensor{Join(address, py::str(name)),
                                                                THPVariable_Unpack(value.ptr())});
        }
      }
    }
    for (auto [name, child] : DictAttribute(module, "_modules")) {
      if (child.is_none() || !seen_modules.insert(child.ptr()).second) continue;
      Visit(child, Join(address, py::str(name)));
    }
  }
};

// NOTE [Eager module scopes]: a module's scoped forward.
struct ScopedForward {
  PyObject_HEAD
  PyObject* original;  // the callable `module.forward` gave before (a bound method)
  const void* module;  // identity of the module, for EagerModuleScope
  vectorcallfunc vectorcall;
};

PyObject* CallScoped(PyObject* callable, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  auto* self = reinterpret_cast<ScopedForward*>(callable);
  EagerModuleScope scope(self->module);
  return PyObject_Vectorcall(self->original, args, nargsf, kwnames);
}

int Traverse(PyObject* object, visitproc visit, void* arg) {
  Py_VISIT(reinterpret_cast<ScopedForward*>(object)->original);
  Py_VISIT(Py_TYPE(object));
  return 0;
}

int Clear(PyObject* object) {
  Py_CLEAR(reinterpret_cast<ScopedForward*>(object)->original);
  return 0;
}

void Dealloc(PyObject* object) {
  PyTypeObject* type = Py_TYPE(object);
  PyObject_GC_UnTrack(object);
  Clear(object);
  type->tp_free(object);
  Py_DECREF(type);
}

PyMemberDef scoped_forward_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(ScopedForward, vectorcall), READONLY, nullptr},
    {nullptr, 0, 0, 0, nullptr},
};

PyType_Slot scoped_forward_slots[] = {
    {Py_tp_call, reinterpret_cast<void*>(PyVectorcall_Call)},
    {Py_tp_traverse, reinterpret_cast<void*>(Traverse)},
    {Py_tp_clear, reinterpret_cast<void*>(Clear)},
    {Py_tp_dealloc, reinterpret_cast<void*>(Dealloc)},
    {Py_tp_members, scoped_forward_members},
    {Py_tp_doc, const_cast<char*>(
                    "A module's forward while torchlens_cpp captures it: calls the module's own "
                    "forward inside the module's scope (NOTE [Eager module scopes]).")},
    {0, nullptr},
};

PyType_Spec scoped_forward_spec = {
    "torchlens_cpp._C.ScopedForward",
    sizeof(ScopedForward),
    0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    scoped_forward_slots,
};

PyTypeObject* scoped_forward_type = nullptr;

// Per module with scoped forwards installed (the GIL guards it): how many captures use
// them, and the `forward` the instance held itself before, if any (a new reference).
struct Installed {
  int captures = 0;
  PyObject* previous = nullptr;
};
absl::flat_hash_map<PyObject*, Installed>& InstalledScopes() {
  static auto* installed = new absl::flat_hash_map<PyObject*, Installed>();
  return *installed;
}

}  // namespace

bool InitScopedForwardType() {
  scoped_forward_type = reinterpret_cast<PyTypeObject*>(PyType_FromSpec(&scoped_forward_spec));
  return scoped_forward_type != nullptr;
}

EagerModel ReadEagerModel(py::handle model, std::vector<py::object>* modules) {
  EagerModel described;
  Walk walk{&described, modules, {}, {}};
  walk.seen_modules.insert(model.ptr());
  walk.Visit(model, "");
  described.training = py::bool_(py::getattr(model, "training", py::bool_(false)));
  return described;
}

void OpenModuleScopes(const std::vector<py::object>& modules, py::handle script_module_type) {
  for (const py::object& module : modules) {
    if (PyObject_IsInstance(module.ptr(), script_module_type.ptr()) == 1) continue;
    PyObject** dict = _PyObject_GetDictPtr(module.ptr());
    if (dict == nullptr || *dict == nullptr) continue;
    Installed& installed = InstalledScopes()[module.ptr()];
    if (installed.captures++ > 0) continue;
    PyObject* original = PyObject_GetAttrString(module.ptr(), "forward");
    if (original == nullptr) {
      PyErr_Clear();
      continue;
    }
    installed.previous = PyDict_GetItemString(*dict, "forward");  // borrowed
    Py_XINCREF(installed.previous);
    auto* scoped = PyObject_GC_New(ScopedForward, scoped_forward_type);
    if (scoped == nullptr) {
      Py_DECREF(original);
      throw py::error_already_set();
    }
    scoped->original = original;
    scoped->module = module.ptr();
    scoped->vectorcall = CallScoped;
    PyObject_GC_Track(scoped);
    const int set = PyDict_SetItemString(*dict, "forward", reinterpret_cast<PyObject*>(scoped));
    Py_DECREF(scoped);
    if (set != 0) throw py::error_already_set();
  }
}

void CloseModuleScopes(const std::vector<py::object>& modules) {
  absl::flat_hash_map<PyObject*, Installed>& all = InstalledScopes();
  for (const py::object& module : modules) {
    auto it = all.find(module.ptr());
    if (it == all.end() || --it->second.captures > 0) continue;
    PyObject* previous = it->second.previous;
    all.erase(it);
    PyObject** dict = _PyObject_GetDictPtr(module.ptr());
    if (dict == nullptr || *dict == nullptr) {
      Py_XDECREF(previous);
      continue;
    }
    PyObject* current = PyDict_GetItemString(*dict, "forward");  // borrowed
    // A forward the model's code put there during the capture stays.
    if (current != nullptr && Py_TYPE(current) == scoped_forward_type) {
      if (previous != nullptr) {
        PyDict_SetItemString(*dict, "forward", previous);
      } else {
        PyDict_DelItemString(*dict, "forward");
      }
    }
    Py_XDECREF(previous);
    if (PyErr_Occurred()) PyErr_Clear();
  }
}

}  // namespace python
}  // namespace torchlens
