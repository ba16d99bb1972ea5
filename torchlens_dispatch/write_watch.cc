#include "torchlens_dispatch/write_watch.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <atomic>
#include <unordered_set>
#include <vector>

#include "torchlens_dispatch/ops/capture_key.h"
#include "torchlens_dispatch/recorder.h"
#include "torchlens_dispatch/testing.h"

namespace torchlens {
namespace {

// See NOTE [Watching nested writes].
void WriteWatchKernel(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                      torch::jit::Stack* stack) {
  if (Recorder* recorder = Recorder::Current()) recorder->OnNestedWrite(op, stack);
  op.redispatchBoxed(keys & kBelowWriteWatchKey, stack);
}

bool DeclaresWrite(const c10::FunctionSchema& schema) {
  for (const c10::Argument& argument : schema.arguments()) {
    if (argument.alias_info() != nullptr && argument.alias_info()->isWrite()) return true;
  }
  return false;
}

struct Registration {
  torch::Library fallthrough{torch::Library::IMPL, "_", kWriteWatchKey, __FILE__, __LINE__};
  std::vector<c10::RegistrationHandleRAII> kernels;
  std::unordered_set<c10::OperatorName> known;  // every operator that existed then
};

// Null until RegisterWriteWatch ran. Never destroyed: a handle released at exit would
// edit dispatch tables while other static destructors may still run models.
std::atomic<Registration*> registered{nullptr};

Registration* Register() {
  static Registration* const registration = [] {
    auto* r = new Registration;
    r->fallthrough.fallback(torch::CppFunction::makeFallthrough());
    c10::Dispatcher& dispatcher = c10::Dispatcher::singleton();
    for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
      r->known.insert(name);
      const c10::optional<c10::OperatorHandle> op = dispatcher.findOp(name);
      if (!op.has_value() || !op->hasSchema() || !DeclaresWrite(op->schema())) continue;
      r->kernels.push_back(dispatcher.registerImpl(
          name, kWriteWatchKey, c10::KernelFunction::makeFromBoxedFunction<&WriteWatchKernel>(),
          c10::nullopt, nullptr, "torchlens write watch (torchlens_dispatch/write_watch.cc)"));
    }
    return r;
  }();
  return registration;
}

}  // namespace

void RegisterWriteWatch() { registered.store(Register(), std::memory_order_release); }

void WatchNestedCallsOfForTesting(const c10::OperatorName& op) {
  RegisterWriteWatch();
  registered.load(std::memory_order_acquire)->known.insert(op);
}

bool WriteWatchCovers(const c10::OperatorHandle& op) {
  const Registration* registration = registered.load(std::memory_order_acquire);
  return registration != nullptr && registration->known.count(op.operator_name()) > 0;
}

}  // namespace torchlens
