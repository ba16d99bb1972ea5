// The `torchlens_cpp._C` extension module: the C++ API (capture.h, graph/trace.h,
// validation/) as Python objects. Each bound function translates its arguments and calls
// the C++ API; the Python API itself (`tl.trace`, `tl.capture`) is torchlens_cpp/__init__.py.
//
// NOTE [Values shared with Python]
// Tensors a trace hands to Python (`Op.out`, `Buffer.value_at`, ...) are detached aliases
// of the values the trace holds: no copy, and a change of their shape or `requires_grad`
// stays Python's. A write into their memory is the trace's too, so the trace remembers the
// version counter of each value it handed out, and of the values it shares with the
// caller from the start (the model's inputs, outputs and parameters, which a capture reads
// by reference). `validate()`, `do()` and `save()` first check that none of them was
// written since (an optimizer step, `out.add_(1)`) and raise tl.Error naming the value
// otherwise: a changed capture is never replayed or written as if it were the captured one.
#include <Python.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/autograd/python_variable.h>

#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "graph/render.h"
#include "graph/summary.h"
#include "graph/trace.h"
#include "graph/trace_file.h"
#include "torchlens_dispatch/capture.h"
#include "torchlens_dispatch/eager_scope.h"
#include "torchlens_dispatch/ops/capture_key.h"
#include "torchlens_dispatch/python/eager_adapter.h"
#include "validation/intervene.h"
#include "validation/validate.h"

namespace py = pybind11;

namespace torchlens {
namespace python {
namespace {

// torchlens' own tensor work (aliases, checks) is never captured, also when Python reads a
// trace inside another capture.
using NoCapture = c10::impl::ExcludeDispatchKeyGuard;

// The module's exception and warning classes (created in PYBIND11_MODULE).
PyObject* error = nullptr;
PyObject* unjournaled_error = nullptr;
PyObject* gap_error = nullptr;
PyObject* gap_warning = nullptr;
PyObject* replay_gap_warning = nullptr;

[[noreturn]] void Raise(PyObject* type, const std::string& message) {
  PyErr_SetString(type, message.c_str());
  throw py::error_already_set();
}

// A failed status as the Python exception its kind maps to.
[[noreturn]] void RaiseStatus(const absl::Status& status) {
  if (status.GetPayload(kUnjournaledWritePayload).has_value()) {
    Raise(unjournaled_error, std::string(status.message()));
  }
  Raise(error, std::string(status.message()));
}

template <typename T>
T ValueOrRaise(absl::StatusOr<T> result) {
  if (!result.ok()) RaiseStatus(result.status());
  return *std::move(result);
}

py::object TensorOrNone(const at::Tensor& tensor) {
  if (!tensor.defined()) return py::none();
  return py::reinterpret_steal<py::object>(THPVariable_Wrap(tensor));
}

// NOTE [Values shared with Python]: one value and its version when it was shared.
struct SharedValue {
  c10::VariableVersion version{c10::VariableVersion::DISABLED};
  uint32_t seen = 0;
  std::string what;  // "the value of relu_1_2:1"
};

// A trace as Python holds it: Op, Buffer and Trace objects share it.
struct TraceHandle {
  Trace trace;
  std::vector<SharedValue> shared;
  std::shared_ptr<TraceHandle> base;  // a fork (do()) shares the values of its base
  py::object output = py::none();     // tl.trace: the forward's return value

  void Share(const at::Tensor& tensor, std::string what) {
    if (!tensor.defined() || tensor.is_inference() ||
        !tensor.unsafeGetTensorImpl()->version_counter().enabled()) {
      return;
    }
    shared.push_back(SharedValue{tensor.unsafeGetTensorImpl()->version_counter(),
                                 static_cast<uint32_t>(tensor._version()), std::move(what)});
  }

  // A detached alias of `tensor` for Python, remembered as shared.
  py::object Hand(const at::Tensor& tensor, std::string what) {
    if (!tensor.defined()) return py::none();
    NoCapture no_capture(kCaptureKey);
    at::Tensor alias = tensor.detach();
    Share(alias, std::move(what));
    return TensorOrNone(alias);
  }

  // Raises tl.Error when a shared value was written since it was shared.
  void CheckUnchanged(const char* action) const {
    for (const TraceHandle* handle = this; handle != nullptr; handle = handle->base.get()) {
      for (const SharedValue& value : handle->shared) {
        if (value.version.current_version() == value.seen) continue;
        Raise(error,
              absl::StrCat(value.what,
                           " was written in place after the capture (its version "
                           "went from ",
                           value.seen, " to ", value.version.current_version(),
                           "), so this trace no longer holds what was captured and cannot ", action,
                           ". Clone values before writing them (t.clone()), or capture again "
                           "after the change (an optimizer step writes the parameters)"));
      }
    }
  }
};
using Handle = std::shared_ptr<TraceHandle>;

// A node of a trace: one of its ops, or of its backward ops (NOTE [Gradients in a trace] in
// graph/gradients.h), which the next backward call replaces.
struct OpRef {
  Handle handle;
  int index;
  bool backward = false;
  const Op& op() const {
    if (!backward) return handle->trace.ops()[index];
    const std::vector<const Op*> ops = handle->trace.backward_ops();
    if (static_cast<size_t>(index) >= ops.size()) {
      Raise(error,
            "this backward op belongs to an earlier backward call; read trace.backward_ops "
            "again after each backward()");
    }
    return *ops[index];
  }
};

struct BufferRef {
  Handle handle;
  const Buffer* buffer;
};

py::object WriteKindOrNone(const std::optional<WriteKind>& kind) {
  if (!kind.has_value()) return py::none();
  return py::str(std::string(WriteKindName(*kind)));
}

std::vector<OpRef> OpRefs(const Handle& handle, const std::vector<const Op*>& ops) {
  std::vector<OpRef> refs;
  refs.reserve(ops.size());
  for (const Op* op : ops) refs.push_back(OpRef{handle, handle->trace.IndexOf(op)});
  return refs;
}

std::string Repr(const Op& op) {
  std::string repr = absl::StrCat("<Op ", op.label, " ", op.type);
  if (!op.tensor_shape.empty() || !op.tensor_dtype.empty()) {
    absl::StrAppend(&repr, " ", FormatShape(op.tensor_shape));
  }
  if (!op.module_address.empty()) absl::StrAppend(&repr, " in '", op.module_address, "'");
  return repr + ">";
}

ShowBuffers ParseShowBuffers(const std::string& show) {
  if (show == "never") return ShowBuffers::kNever;
  if (show == "meaningful") return ShowBuffers::kMeaningful;
  if (show == "always") return ShowBuffers::kAlways;
  Raise(PyExc_ValueError, absl::StrCat("show_buffers is \"", show,
                                       "\"; expected \"never\", \"meaningful\" or \"always\""));
}

const Op& FindOrKeyError(const Trace& trace, const std::string& key) {
  absl::StatusOr<const Op*> found = trace.Find(key);
  if (!found.ok()) Raise(PyExc_KeyError, std::string(found.status().message()));
  return **found;
}

at::Tensor TensorArgument(py::handle value, const std::string& what) {
  if (!THPVariable_Check(value.ptr())) {
    Raise(PyExc_TypeError, absl::StrCat(what, " must be a torch.Tensor, not ",
                                        std::string(py::str(py::type::handle_of(value)))));
  }
  return THPVariable_Unpack(value.ptr());
}

// NOTE [Eager module scopes] in eager_adapter.h: one capture of an eager model.
class EagerCapture {
 public:
  EagerCapture(py::handle model, py::handle script_module_type, bool save,
               bool allow_unjournaled_writes, bool save_grads)
      : thread_(std::this_thread::get_id()), reading_(ReadEagerModel(model, script_module_type)) {
    // The forward may drop a module from the model: the capture keeps every module it
    // scoped or reads buffers of alive until it ends.
    held_.reserve(reading_->modules.size());
    for (PyObject* module : reading_->modules) {
      held_.push_back(py::reinterpret_borrow<py::object>(module));
    }
    CaptureOptions options;
    options.save_activations = save;
    options.allow_unjournaled_writes = allow_unjournaled_writes;
    options.save_grads = save_grads;
    guard_ = std::make_unique<CaptureGuard>(reading_->model, std::move(options));
    if (!guard_->active()) {
      absl::Status why = guard_->Finish(c10::IValue()).status();
      guard_.reset();
      Raise(error, absl::StrCat("cannot capture: ", why.message()));
    }
    OpenModuleScopes(*reading_);
    scopes_open_ = true;
  }
  ~EagerCapture() {
    if (scopes_open_) CloseModuleScopes(*reading_);
  }

  // The classes whose `__setattr__` and `register_buffer` the capture patches (NOTE
  // [Patched module classes] in torchlens_cpp/__init__.py): those of the modules that own
  // buffers.
  py::tuple buffer_classes() const { return reading_->buffer_classes; }

  void MarkInputs(const py::list& tensors) {
    CheckThread("mark inputs");
    std::vector<c10::IValue> inputs;
    for (py::handle tensor : tensors) {
      inputs_.push_back(TensorArgument(tensor, "an input"));
      inputs.emplace_back(inputs_.back());
    }
    guard_->MarkInputs(c10::ivalue::Tuple::create(std::move(inputs)));
  }

  // The end of the capture's scope: what the buffer slots hold now (`_buffers[name] = t`
  // writes no version until here), then the thread stops capturing and the scopes close.
  void Stop() {
    if (stopped_) return;
    CheckThread("end");
    stopped_ = true;
    for (const auto& [module, name] : reading_->buffers) {
      py::object buffers = py::getattr(module, "_buffers", py::none());
      if (!PyDict_Check(buffers.ptr())) continue;
      PyObject* value = PyDict_GetItemString(buffers.ptr(), name.c_str());  // borrowed
      if (value != nullptr && THPVariable_Check(value)) {
        ReportBufferAssigned(module, name, THPVariable_Unpack(value));
      }
    }
    guard_->Stop();
    CloseModuleScopes(*reading_);
    scopes_open_ = false;
  }

  Handle Finish(const py::list& outputs) {
    Stop();
    std::vector<c10::IValue> values;
    std::vector<at::Tensor> tensors;
    for (py::handle output : outputs) {
      tensors.push_back(TensorArgument(output, "an output"));
      values.emplace_back(tensors.back());
    }
    absl::StatusOr<Trace> trace = guard_->Finish(c10::ivalue::Tuple::create(std::move(values)));
    if (!trace.ok()) RaiseStatus(trace.status());
    return Shared(*std::move(trace), tensors);
  }

  Handle FinishAfterError(const std::string& reason) {
    Stop();
    return Shared(ValueOrRaise(guard_->FinishAfterForwardError(reason)), {});
  }

 private:
  void CheckThread(const char* action) const {
    if (std::this_thread::get_id() != thread_) {
      Raise(error, absl::StrCat("a capture must ", action,
                                " on the thread that started it (it captures that thread only)"));
    }
  }

  // NOTE [Values shared with Python]: the inputs, outputs and parameters.
  Handle Shared(Trace trace, const std::vector<at::Tensor>& outputs) {
    auto handle = std::make_shared<TraceHandle>();
    handle->trace = std::move(trace);
    NoCapture no_capture(kCaptureKey);
    for (size_t i = 0; i < inputs_.size(); ++i) {
      handle->Share(inputs_[i], absl::StrCat("input ", i + 1, " of the forward"));
    }
    for (size_t i = 0; i < outputs.size(); ++i) {
      handle->Share(outputs[i], absl::StrCat("output ", i + 1, " of the forward"));
    }
    for (const EagerModel::Tensor& param : reading_->model.params) {
      handle->Share(param.tensor, absl::StrCat("parameter '", param.address, "'"));
    }
    return handle;
  }

  std::thread::id thread_;
  std::shared_ptr<EagerReading> reading_;
  std::vector<py::object> held_;  // the reading's modules
  std::vector<at::Tensor> inputs_;
  std::unique_ptr<CaptureGuard> guard_;
  bool scopes_open_ = false;
  bool stopped_ = false;
};

// The patched `__setattr__` and `register_buffer` of the model's classes report here.
void BufferAssigned(py::handle module, const std::string& name, py::handle value) {
  if (!THPVariable_Check(value.ptr())) return;
  NoCapture no_capture(kCaptureKey);
  // The recorder runs its own tensor work uncaptured; the key is excluded here too so that
  // nothing the report does is mistaken for the forward's.
  ReportBufferAssigned(module.ptr(), name, THPVariable_Unpack(value.ptr()));
}

Handle DoEdits(const Handle& handle, const py::dict& edits, bool strict) {
  handle->CheckUnchanged("replay edits");
  std::vector<Edit> list;
  for (auto [key, value] : edits) {
    const std::string label = py::str(key);
    FindOrKeyError(handle->trace, label);
    list.push_back(Edit{label, TensorArgument(value, absl::StrCat("the edit of ", label))});
  }
  absl::StatusOr<DoResult> result;
  {
    py::gil_scoped_release no_gil;
    NoCapture no_capture(kCaptureKey);
    result = Do(handle->trace, std::move(list), DoOptions{/*strict=*/false});
  }
  if (!result.ok()) RaiseStatus(result.status());
  for (const Diagnostic& gap : result->warnings) {
    const bool buffer_gap = gap.kind == DiagnosticKind::kBufferThreadGap;
    if (strict) Raise(buffer_gap ? gap_error : error, gap.message);
    if (PyErr_WarnEx(buffer_gap ? gap_warning : replay_gap_warning, gap.message.c_str(), 2) != 0) {
      throw py::error_already_set();  // warnings turned into errors (-W error)
    }
  }
  auto fork = std::make_shared<TraceHandle>();
  fork->trace = std::move(result->trace);
  fork->base = handle;
  return fork;
}

PyObject* NewException(const char* name, const char* doc, PyObject* base) {
  PyObject* type = PyErr_NewExceptionWithDoc(name, doc, base, nullptr);
  if (type == nullptr) throw py::error_already_set();
  return type;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "torchlens_cpp's C++ core. Use the torchlens_cpp package, not this module.";
  if (!InitScopedForwardType()) throw py::error_already_set();

  error = NewException("torchlens_cpp.Error",
                       "An error of torchlens_cpp itself (not of the model's forward).",
                       PyExc_RuntimeError);
  unjournaled_error = NewException(
      "torchlens_cpp.UnjournaledBufferWriteError",
      "A registered buffer changed without a journaled write (`.data = t`, set_data); pass "
      "allow_unjournaled_writes=True to get the trace with a diagnostic instead.",
      error);
  gap_error = NewException("torchlens_cpp.BufferThreadGapError",
                           "Under do(..., strict=True): a buffer version in the edit's cone "
                           "could not be recomputed and would keep its captured value.",
                           error);
  gap_warning = NewException("torchlens_cpp.BufferThreadGapWarning",
                             "do(): a buffer version in the edit's cone kept its captured "
                             "value, because recomputing it could not be certified.",
                             PyExc_UserWarning);
  replay_gap_warning = NewException(
      "torchlens_cpp.ReplayGapWarning",
      "do(): a value outside the graph (a Python number an op returned, a tensor changed "
      "through a view) kept its captured value.",
      PyExc_UserWarning);
  m.attr("Error") = py::handle(error);
  m.attr("UnjournaledBufferWriteError") = py::handle(unjournaled_error);
  m.attr("BufferThreadGapError") = py::handle(gap_error);
  m.attr("BufferThreadGapWarning") = py::handle(gap_warning);
  m.attr("ReplayGapWarning") = py::handle(replay_gap_warning);

  py::class_<OpRef>(m, "Op", "One node of a trace: an op, an input or output, or a buffer version.")
      .def_property_readonly("label", [](const OpRef& r) { return r.op().label; })
      .def_property_readonly("type", [](const OpRef& r) { return r.op().type; })
      .def_property_readonly("func_name", [](const OpRef& r) { return r.op().func_name; })
      .def_property_readonly("parents", [](const OpRef& r) { return r.op().parents; })
      .def_property_readonly("children", [](const OpRef& r) { return r.op().children; })
      .def_property_readonly("module_address", [](const OpRef& r) { return r.op().module_address; })
      .def_property_readonly(
          "out",
          [](const OpRef& r) {
            return r.handle->Hand(r.op().out, absl::StrCat("the value of ", r.op().label));
          },
          "The saved value (the first tensor output), or None when not saved.")
      .def_property_readonly(
          "outs",
          [](const OpRef& r) {
            py::list outs;
            for (const at::Tensor& out : r.op().outs) {
              outs.append(r.handle->Hand(out, absl::StrCat("an output of ", r.op().label)));
            }
            return outs;
          },
          "Every tensor output, in return order.")
      .def_property_readonly("is_buffer", [](const OpRef& r) { return r.op().is_buffer; })
      .def_property_readonly("address", [](const OpRef& r) { return r.op().address; })
      .def_property_readonly("buffer_pass", [](const OpRef& r) { return r.op().buffer_pass; })
      .def_property_readonly(
          "buffer_write_kind",
          [](const OpRef& r) { return WriteKindOrNone(r.op().buffer_write_kind); },
          "\"reassign\", \"inplace\" or \"fused\" for a buffer write; None for a read.")
      .def_property_readonly("buffer_value_changed",
                             [](const OpRef& r) -> py::object {
                               const std::optional<bool>& changed = r.op().buffer_value_changed;
                               if (!changed.has_value()) return py::none();
                               return py::bool_(*changed);
                             })
      .def_property_readonly("pass_num", [](const OpRef& r) { return r.op().pass; })
      .def_property_readonly("tensor_shape",
                             [](const OpRef& r) {
                               return std::vector<int64_t>(r.op().tensor_shape.begin(),
                                                           r.op().tensor_shape.end());
                             })
      .def_property_readonly("tensor_dtype", [](const OpRef& r) { return r.op().tensor_dtype; })
      .def_property_readonly("parent_params",
                             [](const OpRef& r) {
                               return std::vector<std::string>(r.op().parent_params.begin(),
                                                               r.op().parent_params.end());
                             })
      .def_property_readonly(
          "grad",
          [](const OpRef& r) {
            // Not remembered as shared: a gradient written in place is what
            // validate_gradients() exists to catch.
            NoCapture no_capture(kCaptureKey);
            return TensorOrNone(r.op().grad.defined() ? r.op().grad.detach() : at::Tensor());
          },
          "The gradient of the first output after the latest backward() that reached the "
          "trace (tl.trace(..., save_grads=True)), or None.")
      .def_property_readonly(
          "grads",
          [](const OpRef& r) {
            NoCapture no_capture(kCaptureKey);
            py::list grads;
            for (const at::Tensor& grad : r.op().grads) {
              grads.append(TensorOrNone(grad.defined() ? grad.detach() : at::Tensor()));
            }
            return grads;
          },
          "Every output's gradient (None where none reached it); empty when none did.")
      .def_property_readonly(
          "forward_label", [](const OpRef& r) { return r.op().forward_label; },
          "A backward op: the label of the forward node whose gradient it computes (for a "
          "parameter's accumulation, whose `address` names the parameter, the op that read "
          "it).")
      .def_property_readonly("is_backward", [](const OpRef& r) { return r.op().is_backward(); })
      .def_property_readonly("is_input", [](const OpRef& r) { return r.op().is_input(); })
      .def_property_readonly("is_output", [](const OpRef& r) { return r.op().is_output(); })
      .def("__repr__", [](const OpRef& r) { return Repr(r.op()); });

  py::class_<BufferRef>(m, "Buffer", "A registered buffer's state: its versions and values.")
      .def_property_readonly("address", [](const BufferRef& r) { return r.buffer->address; })
      .def_property_readonly("initial_value",
                             [](const BufferRef& r) {
                               return r.handle->Hand(r.buffer->initial_value,
                                                     absl::StrCat("the initial value of buffer '",
                                                                  r.buffer->address, "'"));
                             })
      .def_property_readonly("final_value",
                             [](const BufferRef& r) {
                               return r.handle->Hand(r.buffer->final_value,
                                                     absl::StrCat("the final value of buffer '",
                                                                  r.buffer->address, "'"));
                             })
      .def_property_readonly(
          "versions", [](const BufferRef& r) { return OpRefs(r.handle, r.buffer->versions); })
      .def_property_readonly("num_overwrites",
                             [](const BufferRef& r) { return r.buffer->num_overwrites; })
      .def_property_readonly("module_address",
                             [](const BufferRef& r) { return r.buffer->module_address; })
      .def_property_readonly("same_tensor_as",
                             [](const BufferRef& r) { return r.buffer->same_tensor_as; })
      .def_property_readonly("shares_storage_with",
                             [](const BufferRef& r) { return r.buffer->shares_storage_with; })
      .def(
          "value_at",
          [](const BufferRef& r, int n) {
            absl::StatusOr<at::Tensor> value = r.buffer->value_at(n);
            if (!value.ok()) Raise(PyExc_IndexError, std::string(value.status().message()));
            return r.handle->Hand(
                *value, absl::StrCat("version ", n, " of buffer '", r.buffer->address, "'"));
          },
          py::arg("n"), "The n-th observed version's value (1-based); IndexError outside.")
      .def(
          "value_after",
          [](const BufferRef& r, int n) {
            absl::StatusOr<at::Tensor> value = r.buffer->value_after(n);
            if (!value.ok()) Raise(PyExc_IndexError, std::string(value.status().message()));
            return r.handle->Hand(*value, absl::StrCat("the value after write ", n, " of buffer '",
                                                       r.buffer->address, "'"));
          },
          py::arg("n"), "The value after the n-th write (1-based); IndexError outside.")
      .def("__repr__", [](const BufferRef& r) {
        return absl::StrCat("<Buffer ", r.buffer->address, ": ", r.buffer->versions.size(),
                            " versions, ", r.buffer->num_overwrites, " overwrites>");
      });

  py::class_<Module>(m, "Module", "A module of the model: its type, buffers and parameters.")
      .def_readonly("address", &Module::address)
      .def_readonly("type_name", &Module::type_name)
      .def_readonly("buffers", &Module::buffers)
      .def_readonly("params", &Module::params)
      .def("__repr__", [](const Module& module) {
        return absl::StrCat("<Module '", module.address, "' ", module.type_name, ">");
      });

  py::class_<Param>(m, "Param", "A parameter of the model: its shape and module.")
      .def_readonly("address", &Param::address)
      .def_property_readonly("shape", [](const Param& p) { return py::tuple(py::cast(p.shape)); })
      .def_readonly("module_address", &Param::module_address)
      .def("__repr__", [](const Param& p) {
        return absl::StrCat("<Param ", p.address, " ", FormatShape(p.shape), ">");
      });

  py::class_<ValidationReport>(m, "ValidationReport", "What ValidateForwardPass found.")
      .def_readonly("passed", &ValidationReport::passed)
      .def_readonly("ops_checked", &ValidationReport::ops_checked)
      .def_readonly("failures", &ValidationReport::failures)
      .def_readonly("dead", &ValidationReport::dead)
      .def_readonly("unproved", &ValidationReport::unproved)
      .def_readonly("not_checked", &ValidationReport::not_checked)
      .def_readonly("state_transition_only", &ValidationReport::state_transition_only)
      .def_readonly("perturbations_checked", &ValidationReport::perturbations_checked)
      .def("__repr__", [](const ValidationReport& r) {
        return absl::StrCat("<ValidationReport ", r.passed ? "passed" : "FAILED", ": ",
                            r.ops_checked, " checked, ", r.failures.size(), " failures, ",
                            r.unproved.size(), " unproved, ", r.dead.size(), " dead>");
      });

  py::class_<TraceHandle, Handle>(m, "Trace", "A captured forward pass.")
      .def_property_readonly("ops",
                             [](const Handle& h) {
                               std::vector<OpRef> ops;
                               ops.reserve(h->trace.ops().size());
                               for (size_t i = 0; i < h->trace.ops().size(); ++i) {
                                 ops.push_back(OpRef{h, static_cast<int>(i)});
                               }
                               return ops;
                             })
      .def("__getitem__",
           [](const Handle& h, const std::string& key) {
             return OpRef{h, h->trace.IndexOf(&FindOrKeyError(h->trace, key))};
           })
      .def("__contains__",
           [](const Handle& h, const std::string& key) { return h->trace.Find(key).ok(); })
      .def("__len__", [](const Handle& h) { return h->trace.ops().size(); })
      .def_property_readonly("buffers",
                             [](const Handle& h) {
                               py::dict buffers;
                               for (const auto& [address, buffer] : h->trace.buffers()) {
                                 buffers[py::str(address)] = BufferRef{h, &buffer};
                               }
                               return buffers;
                             })
      .def_property_readonly("modules",
                             [](const Handle& h) {
                               py::dict modules;
                               for (const auto& [address, module] : h->trace.modules()) {
                                 modules[py::str(address)] = module;
                               }
                               return modules;
                             })
      .def_property_readonly("params",
                             [](const Handle& h) {
                               py::dict params;
                               for (const auto& [address, param] : h->trace.params()) {
                                 params[py::str(address)] = param;
                               }
                               return params;
                             })
      .def_property_readonly("buffer_read_ops",
                             [](const Handle& h) { return OpRefs(h, h->trace.buffer_read_ops()); })
      .def_property_readonly("buffer_write_ops",
                             [](const Handle& h) { return OpRefs(h, h->trace.buffer_write_ops()); })
      .def_property_readonly(
          "backward_ops",
          [](const Handle& h) {
            std::vector<OpRef> ops;
            const size_t count = h->trace.backward_ops().size();
            for (size_t i = 0; i < count; ++i) ops.push_back(OpRef{h, static_cast<int>(i), true});
            return ops;
          },
          "The ops autograd ran in the latest backward() that reached the trace, in execution "
          "order, each linked to its forward node (Op.forward_label).")
      .def_property_readonly(
          "param_grads",
          [](const Handle& h) {
            NoCapture no_capture(kCaptureKey);
            py::dict grads;
            for (const auto& [address, grad] : h->trace.param_grads()) {
              grads[py::str(address)] = TensorOrNone(grad.detach());
            }
            return grads;
          },
          "The parameters' gradients from that backward, by address.")
      .def_property_readonly("records_gradients",
                             [](const Handle& h) { return h->trace.records_gradients(); })
      .def_property_readonly("input_labels",
                             [](const Handle& h) { return h->trace.input_labels(); })
      .def_property_readonly("output_labels",
                             [](const Handle& h) { return h->trace.output_labels(); })
      .def_property(
          "output", [](const Handle& h) { return h->output; },
          [](const Handle& h, py::object output) { h->output = std::move(output); },
          "tl.trace: the forward's return value, as the model returned it.")
      .def_property_readonly("diagnostics",
                             [](const Handle& h) {
                               std::vector<std::string> messages;
                               for (const TraceDiagnostic& d : h->trace.diagnostics()) {
                                 messages.push_back(d.message);
                               }
                               return messages;
                             })
      .def_property_readonly("partial", [](const Handle& h) { return h->trace.partial(); })
      .def_property_readonly("partial_reason",
                             [](const Handle& h) { return h->trace.partial_reason(); })
      .def_property_readonly("training", [](const Handle& h) { return h->trace.training(); })
      .def_property_readonly("has_saved_values",
                             [](const Handle& h) { return h->trace.has_saved_values(); })
      .def(
          "validate",
          [](const Handle& h, int threads) {
            h->CheckUnchanged("be validated");
            absl::StatusOr<ValidationReport> report;
            {
              py::gil_scoped_release no_gil;
              NoCapture no_capture(kCaptureKey);
              report = ValidateForwardPass(h->trace, ValidationOptions{threads});
            }
            return ValueOrRaise(std::move(report));
          },
          py::arg("threads") = 1,
          "Replays every op from its saved arguments and checks values and edges "
          "(ValidateForwardPass); a ValidationReport.")
      .def(
          "validate_gradients",
          [](const Handle& h) {
            h->CheckUnchanged("have its gradients validated");
            absl::StatusOr<ValidationReport> report;
            {
              py::gil_scoped_release no_gil;
              NoCapture no_capture(kCaptureKey);
              report = ValidateGradients(h->trace);
            }
            return ValueOrRaise(std::move(report));
          },
          "Re-runs the backward of every op from its saved arguments and its outputs' saved "
          "gradients and checks each saved gradient (ValidateGradients); a ValidationReport.")
      .def("do", &DoEdits, py::arg("edits"), py::arg("strict") = false,
           "A new Trace with the edits ({label: tensor}) applied and their cone of effect "
           "re-executed; this trace is never written. A buffer version that cannot be "
           "recomputed warns with BufferThreadGapWarning, or raises BufferThreadGapError "
           "with strict=True.")
      .def(
          "to_dot",
          [](const Handle& h, const std::string& show_buffers) {
            RenderOptions options;
            options.show_buffers = ParseShowBuffers(show_buffers);
            return RenderDot(h->trace, options);
          },
          py::arg("show_buffers") = "meaningful",
          "The graph as Graphviz DOT text; show_buffers: \"never\", \"meaningful\", \"always\".")
      .def(
          "render",
          [](const Handle& h, const std::string& path, const std::string& show_buffers) {
            RenderOptions options;
            options.show_buffers = ParseShowBuffers(show_buffers);
            absl::Status rendered;
            {
              py::gil_scoped_release no_gil;
              rendered = RenderToFile(h->trace, path, options);
            }
            if (!rendered.ok()) RaiseStatus(rendered);
          },
          py::arg("path"), py::arg("show_buffers") = "meaningful",
          "Draws the graph to `path` (.svg, .png or .pdf).")
      .def(
          "save",
          [](const Handle& h, const std::string& path) {
            h->CheckUnchanged("be saved");
            absl::Status saved;
            {
              py::gil_scoped_release no_gil;
              NoCapture no_capture(kCaptureKey);
              saved = SaveTrace(h->trace, path);
            }
            if (!saved.ok()) RaiseStatus(saved);
          },
          py::arg("path"),
          "Writes the trace file the command-line tool writes with --save (torch.load reads it).")
      .def(
          "summary", [](const Handle& h) { return FormatSummary(h->trace); },
          "The summary the command-line tool prints.")
      .def("__repr__", [](const Handle& h) {
        return absl::StrCat("<Trace: ", h->trace.ops().size(), " nodes, ",
                            h->trace.buffers().size(), " buffers",
                            h->trace.partial() ? ", partial" : "", ">");
      });

  py::class_<EagerCapture>(m, "_Capture")
      .def(py::init<py::handle, py::handle, bool, bool, bool>())
      .def("buffer_classes", &EagerCapture::buffer_classes)
      .def("mark_inputs", &EagerCapture::MarkInputs)
      .def("stop", &EagerCapture::Stop)
      .def("finish", &EagerCapture::Finish)
      .def("finish_after_error", &EagerCapture::FinishAfterError);

  m.def("_buffer_assigned", &BufferAssigned);
  m.def(
      "load",
      [](const std::string& path) {
        absl::StatusOr<Trace> trace;
        {
          py::gil_scoped_release no_gil;
          NoCapture no_capture(kCaptureKey);
          trace = LoadTrace(path);
        }
        auto handle = std::make_shared<TraceHandle>();
        handle->trace = ValueOrRaise(std::move(trace));
        return handle;
      },
      py::arg("path"), "Reads a trace file (trace.save, or the command-line tool's --save).");
}

}  // namespace python
}  // namespace torchlens
