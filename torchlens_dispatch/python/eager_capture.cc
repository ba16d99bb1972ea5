#include "torchlens_dispatch/python/eager_capture.h"

#include <Python.h>
#include <pybind11/stl.h>
#include <torch/csrc/autograd/python_variable.h>

#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "torchlens_dispatch/capture.h"
#include "torchlens_dispatch/eager_scope.h"
#include "torchlens_dispatch/ops/capture_key.h"
#include "torchlens_dispatch/python/eager_adapter.h"
#include "torchlens_dispatch/python/exceptions.h"
#include "torchlens_dispatch/python/trace_handle.h"

namespace py = pybind11;

namespace torchlens {
namespace python {
namespace {

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
      Raise(Exceptions().error, absl::StrCat("cannot capture: ", why.message()));
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
      Raise(Exceptions().error,
            absl::StrCat("a capture must ", action,
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

}  // namespace

void BindEagerCapture(py::module_& m) {
  py::class_<EagerCapture>(m, "_Capture")
      .def(py::init<py::handle, py::handle, bool, bool, bool>())
      .def("buffer_classes", &EagerCapture::buffer_classes)
      .def("mark_inputs", &EagerCapture::MarkInputs)
      .def("stop", &EagerCapture::Stop)
      .def("finish", &EagerCapture::Finish)
      .def("finish_after_error", &EagerCapture::FinishAfterError);

  m.def("_buffer_assigned", &BufferAssigned);
}

}  // namespace python
}  // namespace torchlens
