#include "tools/output_keeper.h"

#include <ATen/record_function.h>

#include <memory>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"

namespace torchlens {
namespace {

// RecordFunction callbacks are plain function pointers: their state is the thread's.
thread_local int depth = 0;
thread_local bool copy_overwritten = false;
thread_local std::vector<c10::IValue>* kept = nullptr;

std::unique_ptr<at::ObserverContext> Enter(const at::RecordFunction& call) {
  if (++depth == 1 && copy_overwritten && kept != nullptr) {
    const absl::string_view name = call.name();
    const c10::ArrayRef<const c10::IValue> inputs = call.inputs();
    if (absl::EndsWith(name, "_") && !inputs.empty() && inputs[0].isTensor()) {
      kept->push_back(inputs[0].toTensor().clone());  // dispatched at depth 2: not kept
    }
  }
  return nullptr;
}

void Leave(const at::RecordFunction& call, at::ObserverContext*) {
  if (depth-- == 1 && kept != nullptr) {
    for (const c10::IValue& output : call.outputs()) kept->push_back(output);
  }
}

}  // namespace

void RunKeepingOutputs(absl::FunctionRef<void()> forward, bool copy) {
  std::vector<c10::IValue> outputs;
  outputs.reserve(4096);
  kept = &outputs;
  depth = 0;
  copy_overwritten = copy;
  const at::CallbackHandle handle =
      at::addThreadLocalCallback(at::RecordFunctionCallback(&Enter, &Leave)
                                     .needsInputs(copy)
                                     .needsOutputs(true)
                                     .scopes({at::RecordScope::FUNCTION}));
  forward();
  at::removeCallback(handle);
  kept = nullptr;
}

}  // namespace torchlens
