#include "torchlens_dispatch/fallback.h"

#include <torch/library.h>

#include "torchlens_dispatch/ops/capture_key.h"
#include "torchlens_dispatch/recorder.h"
#include "torchlens_dispatch/write_watch.h"

namespace torchlens {
namespace {

// See NOTE [User-level and nested ops]: the recorder does the work.
void CaptureFallback(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                     torch::jit::Stack* stack) {
  Recorder* recorder = Recorder::Current();
  if (recorder == nullptr) {
    // The key is only included by a CaptureGuard, which sets the recorder first; pass
    // through should anything else include it.
    op.redispatchBoxed(keys & kBelowCaptureKey, stack);
    return;
  }
  recorder->OnOp(op, keys, stack);
}

torch::Library RegisterFallback() {
  torch::Library library(torch::Library::IMPL, "_", kCaptureKey, __FILE__, __LINE__);
  library.fallback(torch::CppFunction::makeFromBoxedFunction<&CaptureFallback>());
  return library;
}

const torch::Library& Registration() {
  static const torch::Library library = (RegisterWriteWatch(), RegisterFallback());
  return library;
}

// Registers at load time, before any guard exists, so that no dispatch table changes
// while other threads run models.
const bool kRegisteredAtLoad = (Registration(), true);

}  // namespace

bool CaptureFallbackRegistered() { return kRegisteredAtLoad && (Registration(), true); }

}  // namespace torchlens
