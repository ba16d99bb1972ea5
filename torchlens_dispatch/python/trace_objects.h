// The trace's nodes and entities as Python objects: Op, Buffer, Module and Param. Each
// object holds the trace it belongs to (TraceHandle), so that it stays valid while Python
// holds it; tensors it returns are shared values (NOTE [Values shared with Python] in
// trace_handle.h).
#ifndef TORCHLENS_DISPATCH_PYTHON_TRACE_OBJECTS_H_
#define TORCHLENS_DISPATCH_PYTHON_TRACE_OBJECTS_H_

#include <pybind11/pybind11.h>

#include <string>
#include <vector>

#include "graph/trace.h"
#include "torchlens_dispatch/python/trace_handle.h"

namespace torchlens {
namespace python {

// A node of a trace: one of its ops, or of its backward ops (NOTE [Gradients in a trace] in
// graph/gradients.h), which the next backward call replaces.
struct OpRef {
  Handle handle;
  int index;
  bool backward = false;
  // Raises tl.Error for a backward op of an earlier backward call.
  const Op& op() const;
};

struct BufferRef {
  Handle handle;
  const Buffer* buffer;
};

std::vector<OpRef> OpRefs(const Handle& handle, const std::vector<const Op*>& ops);

// The node `key` names (Trace::Find); KeyError otherwise.
const Op& FindOrKeyError(const Trace& trace, const std::string& key);

// Adds the classes Op, Buffer, Module and Param to `m`.
void BindTraceObjects(pybind11::module_& m);

}  // namespace python
}  // namespace torchlens

#endif  // TORCHLENS_DISPATCH_PYTHON_TRACE_OBJECTS_H_
