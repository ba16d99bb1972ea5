// The `torchlens_cpp._C` extension module: the C++ API (capture.h, graph/trace.h,
// validation/) as Python objects. Each bound function translates its arguments and calls
// the C++ API; the Python API itself (`tl.trace`, `tl.capture`) is torchlens_cpp/__init__.py.
//
// The bindings live by concern: exceptions.h (the exception and warning classes),
// trace_handle.h (a trace as Python holds it, NOTE [Values shared with Python]),
// trace_objects.h (Op, Buffer, Module, Param), trace_binding.h (Trace, ValidationReport,
// load) and eager_capture.h (the eager capture that tl.capture drives).
#include <pybind11/pybind11.h>

#include "torchlens_dispatch/python/eager_adapter.h"
#include "torchlens_dispatch/python/eager_capture.h"
#include "torchlens_dispatch/python/exceptions.h"
#include "torchlens_dispatch/python/trace_binding.h"
#include "torchlens_dispatch/python/trace_objects.h"

namespace py = pybind11;

namespace torchlens {
namespace python {

PYBIND11_MODULE(_C, m) {
  m.doc() = "torchlens_cpp's C++ core. Use the torchlens_cpp package, not this module.";
  if (!InitScopedForwardType()) throw py::error_already_set();
  AddExceptionClasses(m);
  BindTraceObjects(m);
  BindTrace(m);
  BindEagerCapture(m);
}

}  // namespace python
}  // namespace torchlens
