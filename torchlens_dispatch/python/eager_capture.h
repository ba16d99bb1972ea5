// The eager capture of the extension module, `_Capture`: torchlens_cpp/__init__.py's
// `tl.capture` and `tl.trace` drive it. It reads the model (eager_adapter.h), holds the
// CaptureGuard for the capture's thread, opens and closes the module scopes (NOTE [Eager
// module scopes] in eager_adapter.h), and ends in a Trace whose inputs, outputs and
// parameters are shared values (NOTE [Values shared with Python] in trace_handle.h).
// `_buffer_assigned` is where the patched `__setattr__` and `register_buffer` of the
// model's classes report.
#ifndef TORCHLENS_DISPATCH_PYTHON_EAGER_CAPTURE_H_
#define TORCHLENS_DISPATCH_PYTHON_EAGER_CAPTURE_H_

#include <pybind11/pybind11.h>

namespace torchlens {
namespace python {

// Adds the class _Capture and the function _buffer_assigned to `m`.
void BindEagerCapture(pybind11::module_& m);

}  // namespace python
}  // namespace torchlens

#endif  // TORCHLENS_DISPATCH_PYTHON_EAGER_CAPTURE_H_
