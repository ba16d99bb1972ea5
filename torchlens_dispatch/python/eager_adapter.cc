#include "torchlens_dispatch/python/eager_adapter.h"

#include <Python.h>
#include <structmember.h>
#include <torch/csrc/autograd/python_variable.h>

#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "torchlens_dispatch/eager_scope.h"

namespace py = pybind11;

namespace torchlens {
namespace python {
namespace {

// NOTE [Eager readings reused]: PEP 509's version tag, which Python 3.11 keeps in every
// dict (3.12 deprecates it; a build against a Python without it must check otherwise).
static_assert(PY_VERSION_HEX < 0x030C0000, "dict version tags: see NOTE [Eager readings reused]");
uint64_t Tag(PyObject* dict) { return reinterpret_cast<PyDictObject*>(dict)->ma_version_tag; }

PyObject* InstanceDict(PyObject* object) {
  PyObject** dict = _PyObject_GetDictPtr(object);
  return dict == nullptr ? nullptr : *dict;
}

std::string Join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

// NOTE [Eager module scopes]: a scoped forward. In a class (`module` null) it is the
// class's forward function, bound to the instance as a function is; in an instance's dict
// (`module` set) it wraps the callable the instance held there.
struct ScopedForward {
  PyObject_HEAD PyObject* function;
  PyObject* module;  // borrowed: the module holds this object while it is installed
  vectorcallfunc vectorcall;
};

PyObject* CallScoped(PyObject* callable, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  auto* self = reinterpret_cast<ScopedForward*>(callable);
  PyObject* module = self->module;
  if (module == nullptr) {
    if (PyVectorcall_NARGS(nargsf) == 0) {  // called unbound without an instance
      return PyObject_Vectorcall(self->function, args, nargsf, kwnames);
    }
    module = args[0];
  }
  EagerModuleScope scope(module);
  return PyObject_Vectorcall(self->function, args, nargsf, kwnames);
}

// In a class: `instance.forward` binds, as a function does.
PyObject* BindScoped(PyObject* self, PyObject* instance, PyObject* /*owner*/) {
  if (instance == nullptr || instance == Py_None ||
      reinterpret_cast<ScopedForward*>(self)->module != nullptr) {
    Py_INCREF(self);
    return self;
  }
  return PyMethod_New(self, instance);
}

int Traverse(PyObject* object, visitproc visit, void* arg) {
  Py_VISIT(reinterpret_cast<ScopedForward*>(object)->function);
  Py_VISIT(Py_TYPE(object));
  return 0;
}

int Clear(PyObject* object) {
  Py_CLEAR(reinterpret_cast<ScopedForward*>(object)->function);
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
    {Py_tp_descr_get, reinterpret_cast<void*>(BindScoped)},
    {Py_tp_traverse, reinterpret_cast<void*>(Traverse)},
    {Py_tp_clear, reinterpret_cast<void*>(Clear)},
    {Py_tp_dealloc, reinterpret_cast<void*>(Dealloc)},
    {Py_tp_members, scoped_forward_members},
    {Py_tp_doc,
     const_cast<char*>("A module's forward while torchlens_cpp captures it: calls the module's own "
                       "forward inside the module's scope (NOTE [Eager module scopes]).")},
    {0, nullptr},
};

PyType_Spec scoped_forward_spec = {
    "torchlens_cpp._C.ScopedForward",
    sizeof(ScopedForward),
    0,
    // A method descriptor: `self.forward(x)` calls it with self first, binding nothing.
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
        Py_TPFLAGS_METHOD_DESCRIPTOR,
    scoped_forward_slots,
};

PyTypeObject* scoped_forward_type = nullptr;

PyObject* NewScopedForward(PyObject* function, PyObject* module) {
  auto* scoped = PyObject_GC_New(ScopedForward, scoped_forward_type);
  if (scoped == nullptr) throw py::error_already_set();
  Py_INCREF(function);
  scoped->function = function;
  scoped->module = module;
  scoped->vectorcall = CallScoped;
  PyObject_GC_Track(scoped);
  return reinterpret_cast<PyObject*>(scoped);
}

PyObject* ForwardName() {
  static PyObject* name = PyUnicode_InternFromString("forward");
  return name;
}

// The class's forward when it is a plain function, which a ScopedForward can stand in for
// (borrowed), or null.
PyObject* ClassForward(PyTypeObject* type) {
  PyObject* function = _PyType_Lookup(type, ForwardName());
  return function != nullptr && PyFunction_Check(function) ? function : nullptr;
}

// The dict a module holds under `name` (`_parameters`, ...), or null when it holds none or
// something that is not a dict.
PyObject* MemberDict(PyObject* dict, const char* name) {
  if (dict == nullptr) return nullptr;
  PyObject* member = PyDict_GetItemString(dict, name);  // borrowed
  return member != nullptr && PyDict_Check(member) ? member : nullptr;
}

// NOTE [Eager module scopes]: the patches installed (the GIL guards them), by class and by
// instance: how many captures use each, what they replaced (a new reference, or null for
// an attribute the class inherited), and the scoped forward put there.
struct Patch {
  int captures = 0;
  PyObject* replaced = nullptr;
  PyObject* scoped = nullptr;
};
absl::flat_hash_map<PyObject*, Patch>& Patches() {
  static auto* patches = new absl::flat_hash_map<PyObject*, Patch>();
  return *patches;
}

// Puts a scoped forward for `function` (called on `module` when set) as `owner.forward`
// (`owner` a class, or an instance's dict), or counts one more capture of the one there.
// Whether a scoped forward can stand in for `type`'s forward, or already does (another
// capture's, still running).
bool Scopable(PyTypeObject* type) {
  return ClassForward(type) != nullptr || Patches().contains(reinterpret_cast<PyObject*>(type));
}

struct Walk {
  EagerReading* reading;
  py::handle script_module_type;
  absl::flat_hash_set<PyObject*> seen_modules = {}, seen_params = {}, seen_buffers = {};
  bool checkable = true;

  void Visit(PyObject* module, const std::string& address) {
    EagerModel& model = reading->model;
    PyObject* dict = InstanceDict(module);
    reading->modules.push_back(module);
    if (PyObject_IsInstance(module, script_module_type.ptr()) != 1) {
      PyObject* own = dict == nullptr ? nullptr : PyDict_GetItem(dict, ForwardName());
      if (own != nullptr) {
        if (Py_TYPE(own) != scoped_forward_type || Patches().contains(dict)) {
          reading->own_forwards.push_back(module);
        }
      } else if (Scopable(Py_TYPE(module)) && scoped_classes.insert(Py_TYPE(module)).second) {
        reading->scoped_classes.push_back(Py_TYPE(module));
      }
    }
    model.modules.push_back(
        EagerModel::Module{address, py::str(py::type::handle_of(module).attr("__name__")), module});
    EagerReading::ModuleCheck check{module, Py_TYPE(module), dict, {}, {}};
    const char* members[3] = {"_parameters", "_buffers", "_modules"};
    for (int m = 0; m < 3; ++m) check.members[m] = MemberDict(dict, members[m]);
    if (dict == nullptr || check.members[0] == nullptr || check.members[1] == nullptr ||
        check.members[2] == nullptr) {
      checkable = false;
    } else {
      check.tags[0] = Tag(dict);
      for (int m = 0; m < 3; ++m) check.tags[m + 1] = Tag(check.members[m]);
    }
    reading->checks.push_back(check);
    if (PyObject* params = check.members[0]) {
      PyObject *name, *value;
      for (Py_ssize_t pos = 0; PyDict_Next(params, &pos, &name, &value);) {
        if (!THPVariable_Check(value) || !seen_params.insert(value).second) continue;
        const at::Tensor& tensor = THPVariable_Unpack(value);
        model.params.push_back(EagerModel::Tensor{Join(address, py::str(name)), tensor});
        reading->param_checks.push_back(EagerReading::ParamCheck{
            tensor.unsafeGetTensorImpl(),
            tensor.has_storage() ? tensor.storage().unsafeGetStorageImpl() : nullptr,
            tensor.storage_offset(), tensor.numel()});
      }
    }
    bool owns_buffers = false;
    if (PyObject* buffers = check.members[1]) {
      PyObject *name, *value;
      for (Py_ssize_t pos = 0; PyDict_Next(buffers, &pos, &name, &value);) {
        if (!THPVariable_Check(value) || !seen_buffers.insert(value).second) continue;
        const std::string key = py::str(name);
        model.buffers.push_back(
            EagerModel::Buffer{Join(address, key), THPVariable_Unpack(value), module, key});
        reading->buffers.emplace_back(module, key);
        owns_buffers = true;
      }
    }
    if (owns_buffers) buffer_classes.insert(reinterpret_cast<PyObject*>(Py_TYPE(module)));
    // Plain tensor attributes (`self.scale = torch.tensor(2.0)`): constants named by their
    // address when read.
    if (dict != nullptr) {
      PyObject *name, *value;
      for (Py_ssize_t pos = 0; PyDict_Next(dict, &pos, &name, &value);) {
        if (THPVariable_Check(value)) {
          model.tensor_attributes.push_back(
              EagerModel::Tensor{Join(address, py::str(name)), THPVariable_Unpack(value)});
        }
      }
    }
    if (PyObject* children = check.members[2]) {
      PyObject *name, *child;
      for (Py_ssize_t pos = 0; PyDict_Next(children, &pos, &name, &child);) {
        if (child == Py_None || !seen_modules.insert(child).second) continue;
        Visit(child, Join(address, py::str(name)));
      }
    }
  }
  absl::flat_hash_set<PyObject*> buffer_classes;
  absl::flat_hash_set<PyTypeObject*> scoped_classes;
};

bool StillValid(const EagerReading& reading) {
  if (reading.checks.empty()) return false;
  for (const EagerReading::ModuleCheck& check : reading.checks) {
    // Pre-order: this module is still its parent's (or the root), so it is alive.
    if (Py_TYPE(check.module) != check.type || InstanceDict(check.module) != check.dict ||
        Tag(check.dict) != check.tags[0]) {
      return false;
    }
    for (int m = 0; m < 3; ++m) {
      if (Tag(check.members[m]) != check.tags[m + 1]) return false;
    }
  }
  for (const EagerReading::ParamCheck& param : reading.param_checks) {
    const c10::StorageImpl* storage =
        param.tensor->has_storage() ? param.tensor->storage().unsafeGetStorageImpl() : nullptr;
    if (storage != param.storage || param.tensor->storage_offset() != param.offset ||
        param.tensor->numel() != param.numel) {
      return false;
    }
  }
  return true;
}

// NOTE [Eager readings reused]: the readings kept, by root module; a weak reference's
// callback forgets a root's when it dies.
struct Kept {
  py::object weakref;
  std::shared_ptr<EagerReading> reading;
};
absl::flat_hash_map<PyObject*, Kept>& KeptReadings() {
  static auto* kept = new absl::flat_hash_map<PyObject*, Kept>();
  return *kept;
}

void Install(PyObject* owner, PyObject* function, PyObject* module, bool is_class) {
  Patch& patch = Patches()[owner];
  if (patch.captures++ > 0) return;
  if (function == nullptr) {  // nothing to stand in for after all
    Patches().erase(owner);
    return;
  }
  patch.scoped = NewScopedForward(function, module);
  patch.replaced =
      is_class ? PyDict_GetItem(reinterpret_cast<PyTypeObject*>(owner)->tp_dict, ForwardName())
               : PyDict_GetItem(owner, ForwardName());  // borrowed
  Py_XINCREF(patch.replaced);
  const int set = is_class ? PyObject_SetAttr(owner, ForwardName(), patch.scoped)
                           : PyDict_SetItem(owner, ForwardName(), patch.scoped);
  if (set != 0) PyErr_Clear();  // an immutable class: its modules get no scope
}

void Uninstall(PyObject* owner, bool is_class) {
  auto it = Patches().find(owner);
  if (it == Patches().end() || --it->second.captures > 0) return;
  const Patch patch = it->second;
  Patches().erase(it);
  PyObject* dict = is_class ? reinterpret_cast<PyTypeObject*>(owner)->tp_dict : owner;
  // A forward the model's code put there during the capture stays.
  if (PyDict_GetItem(dict, ForwardName()) == patch.scoped) {
    if (patch.replaced != nullptr) {
      is_class ? PyObject_SetAttr(owner, ForwardName(), patch.replaced)
               : PyDict_SetItem(owner, ForwardName(), patch.replaced);
    } else {
      is_class ? PyObject_DelAttr(owner, ForwardName()) : PyDict_DelItem(owner, ForwardName());
    }
  }
  if (PyErr_Occurred()) PyErr_Clear();
  Py_XDECREF(patch.replaced);
  Py_DECREF(patch.scoped);
}

}  // namespace

bool InitScopedForwardType() {
  scoped_forward_type = reinterpret_cast<PyTypeObject*>(PyType_FromSpec(&scoped_forward_spec));
  return scoped_forward_type != nullptr;
}

std::shared_ptr<EagerReading> ReadEagerModel(py::handle model, py::handle script_module_type) {
  absl::flat_hash_map<PyObject*, Kept>& kept = KeptReadings();
  auto found = kept.find(model.ptr());
  std::shared_ptr<EagerReading> reading;
  if (found != kept.end() && StillValid(*found->second.reading)) {
    reading = found->second.reading;
  } else {
    reading = std::make_shared<EagerReading>();
    Walk walk{reading.get(), script_module_type};
    walk.seen_modules.insert(model.ptr());
    walk.Visit(model.ptr(), "");
    if (!walk.checkable) reading->checks.clear();
    py::tuple classes(walk.buffer_classes.size());
    size_t i = 0;
    for (PyObject* cls : walk.buffer_classes)
      classes[i++] = py::reinterpret_borrow<py::object>(cls);
    reading->buffer_classes = std::move(classes);
    reading->model.layout = LayoutOf(reading->model);
    if (found != kept.end()) {
      found->second.reading = reading;
    } else if (!reading->checks.empty()) {
      PyObject* root = model.ptr();
      py::object weakref = py::reinterpret_steal<py::object>(PyWeakref_NewRef(
          root, py::cpp_function([root](py::handle) { KeptReadings().erase(root); }).ptr()));
      if (!weakref) {
        PyErr_Clear();  // a root that takes no weak reference is read every time
      } else {
        kept.emplace(root, Kept{std::move(weakref), reading});
      }
    }
  }
  reading->model.training = py::bool_(py::getattr(model, "training", py::bool_(false)));
  return reading;
}

void OpenModuleScopes(const EagerReading& reading) {
  for (PyTypeObject* type : reading.scoped_classes) {
    Install(reinterpret_cast<PyObject*>(type), ClassForward(type), nullptr, true);
  }
  for (PyObject* module : reading.own_forwards) {
    if (PyObject* dict = InstanceDict(module)) {
      Install(dict, PyDict_GetItem(dict, ForwardName()), module, false);
    }
  }
}

void CloseModuleScopes(const EagerReading& reading) {
  for (PyTypeObject* type : reading.scoped_classes) {
    Uninstall(reinterpret_cast<PyObject*>(type), true);
  }
  for (PyObject* module : reading.own_forwards) {
    if (PyObject* dict = InstanceDict(module)) Uninstall(dict, false);
  }
}

}  // namespace python
}  // namespace torchlens
