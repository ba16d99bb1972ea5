// What the Python front-end reports to this thread's capture of an eager model while its
// forward runs (eager_model.h): the open module calls and buffer reassignments, which the
// dispatcher cannot see.
#ifndef TORCHLENS_DISPATCH_EAGER_SCOPE_H_
#define TORCHLENS_DISPATCH_EAGER_SCOPE_H_

#include <ATen/core/Tensor.h>

#include <string>

namespace torchlens {

// Opens the call of the module whose identity is `module` on this thread's capture, for
// its lifetime: the ops dispatched meanwhile belong to it (the innermost open call), and a
// module called again opens a new pass of its layers (NOTE [Layers and passes] in
// script_sites.h). Does nothing when this thread is not capturing a model that has this
// module. Nests; must be destroyed on the thread that made it, innermost first.
class EagerModuleScope {
 public:
  explicit EagerModuleScope(const void* module);
  ~EagerModuleScope();
  EagerModuleScope(const EagerModuleScope&) = delete;
  EagerModuleScope& operator=(const EagerModuleScope&) = delete;

 private:
  bool entered_;
};

// Tells this thread's capture that the buffer `name` of the module whose identity is
// `module` now holds `tensor` (the module's `__setattr__` or `register_buffer` replaced
// it): a kReassign version when it is another tensor than the one the buffer held. Does
// nothing when this thread is not capturing a model with such a buffer.
void ReportBufferAssigned(const void* module, const std::string& name, const at::Tensor& tensor);

}  // namespace torchlens

#endif  // TORCHLENS_DISPATCH_EAGER_SCOPE_H_
