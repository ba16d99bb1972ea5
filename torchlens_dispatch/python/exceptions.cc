#include "torchlens_dispatch/python/exceptions.h"

#include "torchlens_dispatch/capture_options.h"

namespace py = pybind11;

namespace torchlens {
namespace python {
namespace {

ExceptionClasses classes;

PyObject* NewException(const char* name, const char* doc, PyObject* base) {
  PyObject* type = PyErr_NewExceptionWithDoc(name, doc, base, nullptr);
  if (type == nullptr) throw py::error_already_set();
  return type;
}

}  // namespace

const ExceptionClasses& Exceptions() { return classes; }

void AddExceptionClasses(py::module_& m) {
  classes.error = NewException("torchlens_cpp.Error",
                               "An error of torchlens_cpp itself (not of the model's forward).",
                               PyExc_RuntimeError);
  classes.unjournaled_error = NewException(
      "torchlens_cpp.UnjournaledBufferWriteError",
      "A registered buffer changed without a journaled write (`.data = t`, set_data); pass "
      "allow_unjournaled_writes=True to get the trace with a diagnostic instead.",
      classes.error);
  classes.gap_error = NewException("torchlens_cpp.BufferThreadGapError",
                                   "Under do(..., strict=True): a buffer version in the edit's "
                                   "cone could not be recomputed and would keep its captured "
                                   "value.",
                                   classes.error);
  classes.gap_warning = NewException("torchlens_cpp.BufferThreadGapWarning",
                                     "do(): a buffer version in the edit's cone kept its "
                                     "captured value, because recomputing it could not be "
                                     "certified.",
                                     PyExc_UserWarning);
  classes.replay_gap_warning = NewException(
      "torchlens_cpp.ReplayGapWarning",
      "do(): a value outside the graph (a Python number an op returned, a tensor changed "
      "through a view) kept its captured value.",
      PyExc_UserWarning);
  m.attr("Error") = py::handle(classes.error);
  m.attr("UnjournaledBufferWriteError") = py::handle(classes.unjournaled_error);
  m.attr("BufferThreadGapError") = py::handle(classes.gap_error);
  m.attr("BufferThreadGapWarning") = py::handle(classes.gap_warning);
  m.attr("ReplayGapWarning") = py::handle(classes.replay_gap_warning);
}

void Raise(PyObject* type, const std::string& message) {
  PyErr_SetString(type, message.c_str());
  throw py::error_already_set();
}

void RaiseStatus(const absl::Status& status) {
  if (status.GetPayload(kUnjournaledWritePayload).has_value()) {
    Raise(classes.unjournaled_error, std::string(status.message()));
  }
  Raise(classes.error, std::string(status.message()));
}

}  // namespace python
}  // namespace torchlens
