#include "torchlens_dispatch/eager_scope.h"

#include "torchlens_dispatch/recorder.h"

namespace torchlens {

EagerModuleScope::EagerModuleScope(const void* module) {
  Recorder* recorder = Recorder::Current();
  entered_ = recorder != nullptr && recorder->EnterModule(module);
}

EagerModuleScope::~EagerModuleScope() {
  if (!entered_) return;
  // The capture may have ended inside the call (the forward finished it): then there is
  // no open call to close.
  if (Recorder* recorder = Recorder::Current()) recorder->ExitModule();
}

void ReportBufferAssigned(const void* module, const std::string& name, const at::Tensor& tensor) {
  if (Recorder* recorder = Recorder::Current()) recorder->OnBufferAssigned(module, name, tensor);
}

}  // namespace torchlens
