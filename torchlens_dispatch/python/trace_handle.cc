#include "torchlens_dispatch/python/trace_handle.h"

#include <torch/csrc/autograd/python_variable.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "torchlens_dispatch/ops/capture_key.h"
#include "torchlens_dispatch/python/exceptions.h"

namespace py = pybind11;

namespace torchlens {
namespace python {

py::object TensorOrNone(const at::Tensor& tensor) {
  if (!tensor.defined()) return py::none();
  return py::reinterpret_steal<py::object>(THPVariable_Wrap(tensor));
}

at::Tensor TensorArgument(py::handle value, const std::string& what) {
  if (!THPVariable_Check(value.ptr())) {
    Raise(PyExc_TypeError, absl::StrCat(what, " must be a torch.Tensor, not ",
                                        std::string(py::str(py::type::handle_of(value)))));
  }
  return THPVariable_Unpack(value.ptr());
}

void TraceHandle::Share(const at::Tensor& tensor, std::string what) {
  if (!tensor.defined() || tensor.is_inference() ||
      !tensor.unsafeGetTensorImpl()->version_counter().enabled()) {
    return;
  }
  shared.push_back(SharedValue{tensor.unsafeGetTensorImpl()->version_counter(),
                               static_cast<uint32_t>(tensor._version()), std::move(what)});
}

py::object TraceHandle::Hand(const at::Tensor& tensor, std::string what) {
  if (!tensor.defined()) return py::none();
  NoCapture no_capture(kCaptureKey);
  at::Tensor alias = tensor.detach();
  Share(alias, std::move(what));
  return TensorOrNone(alias);
}

void TraceHandle::CheckUnchanged(const char* action) const {
  for (const TraceHandle* handle = this; handle != nullptr; handle = handle->base.get()) {
    for (const SharedValue& value : handle->shared) {
      if (value.version.current_version() == value.seen) continue;
      Raise(Exceptions().error,
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

}  // namespace python
}  // namespace torchlens
