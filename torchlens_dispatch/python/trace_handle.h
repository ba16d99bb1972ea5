// A trace as Python holds it: the Trace, and the values it shared with Python.
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
#ifndef TORCHLENS_DISPATCH_PYTHON_TRACE_HANDLE_H_
#define TORCHLENS_DISPATCH_PYTHON_TRACE_HANDLE_H_

#include <ATen/core/Tensor.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "graph/trace.h"

namespace torchlens {
namespace python {

// torchlens' own tensor work (aliases, checks) is never captured, also when Python reads a
// trace inside another capture.
using NoCapture = c10::impl::ExcludeDispatchKeyGuard;

// `tensor` as a Python tensor (the same TensorImpl), or None when undefined.
pybind11::object TensorOrNone(const at::Tensor& tensor);

// The tensor a Python argument holds; TypeError naming `what` when it is not a tensor.
at::Tensor TensorArgument(pybind11::handle value, const std::string& what);

// NOTE [Values shared with Python]: one value and its version when it was shared.
struct SharedValue {
  c10::VariableVersion version{c10::VariableVersion::DISABLED};
  uint32_t seen = 0;
  std::string what;  // "the value of relu_1_2:1"
};

// Op, Buffer and Trace objects share it.
struct TraceHandle {
  Trace trace;
  std::vector<SharedValue> shared;
  std::shared_ptr<TraceHandle> base;           // a fork (do()) shares the values of its base
  pybind11::object output = pybind11::none();  // tl.trace: the forward's return value

  // Remembers `tensor`'s version; `what` names it in CheckUnchanged's error.
  void Share(const at::Tensor& tensor, std::string what);

  // A detached alias of `tensor` for Python, remembered as shared.
  pybind11::object Hand(const at::Tensor& tensor, std::string what);

  // Raises tl.Error when a shared value was written since it was shared; `action` ends the
  // message ("cannot be validated").
  void CheckUnchanged(const char* action) const;
};
using Handle = std::shared_ptr<TraceHandle>;

}  // namespace python
}  // namespace torchlens

#endif  // TORCHLENS_DISPATCH_PYTHON_TRACE_HANDLE_H_
