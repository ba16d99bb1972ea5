// The Trace class of the extension module (`trace.validate()`, `do()`, `save()`, ...) and
// `load`. Each method translates its arguments, checks that the trace still holds what was
// captured (NOTE [Values shared with Python] in trace_handle.h) where it replays or writes,
// and calls the C++ API without the GIL.
#ifndef TORCHLENS_DISPATCH_PYTHON_TRACE_BINDING_H_
#define TORCHLENS_DISPATCH_PYTHON_TRACE_BINDING_H_

#include <pybind11/pybind11.h>

namespace torchlens {
namespace python {

// Adds the classes ValidationReport and Trace, and the function load, to `m`.
void BindTrace(pybind11::module_& m);

}  // namespace python
}  // namespace torchlens

#endif  // TORCHLENS_DISPATCH_PYTHON_TRACE_BINDING_H_
