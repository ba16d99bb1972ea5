// The extension module's exception and warning classes, and raising them from C++.
//
// A failed absl::Status becomes the Python exception its kind maps to (RaiseStatus):
// tl.UnjournaledBufferWriteError for an unjournaled buffer write, tl.Error otherwise. The
// warnings go through Python's `warnings` module, so that filters and `-W error` apply.
#ifndef TORCHLENS_DISPATCH_PYTHON_EXCEPTIONS_H_
#define TORCHLENS_DISPATCH_PYTHON_EXCEPTIONS_H_

#include <Python.h>
#include <pybind11/pybind11.h>

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace torchlens {
namespace python {

// The classes AddExceptionClasses creates; null before.
struct ExceptionClasses {
  PyObject* error = nullptr;               // torchlens_cpp.Error
  PyObject* unjournaled_error = nullptr;   // torchlens_cpp.UnjournaledBufferWriteError
  PyObject* gap_error = nullptr;           // torchlens_cpp.BufferThreadGapError
  PyObject* gap_warning = nullptr;         // torchlens_cpp.BufferThreadGapWarning
  PyObject* replay_gap_warning = nullptr;  // torchlens_cpp.ReplayGapWarning
};
const ExceptionClasses& Exceptions();

// Creates the classes and adds them to `m` under their names without the package prefix.
void AddExceptionClasses(pybind11::module_& m);

// Sets the Python error and throws pybind11::error_already_set.
[[noreturn]] void Raise(PyObject* type, const std::string& message);

// A failed status as the Python exception its kind maps to.
[[noreturn]] void RaiseStatus(const absl::Status& status);

template <typename T>
T ValueOrRaise(absl::StatusOr<T> result) {
  if (!result.ok()) RaiseStatus(result.status());
  return *std::move(result);
}

}  // namespace python
}  // namespace torchlens

#endif  // TORCHLENS_DISPATCH_PYTHON_EXCEPTIONS_H_
