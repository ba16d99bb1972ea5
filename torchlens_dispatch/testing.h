// Test-only hooks into the capture. Not for production code.
#ifndef TORCHLENS_DISPATCH_TESTING_H_
#define TORCHLENS_DISPATCH_TESTING_H_

#include <ATen/core/operator_name.h>

namespace torchlens {

// On this thread, the capture's next `saves` saved values succeed and the one after
// fails as if out of memory (std::bad_alloc); -1 turns the simulation off.
void FailSavesAfterForTesting(int saves);

// Makes the write watch cover `op` as if it had existed when the watch was registered
// (write_watch.h). Call before any capture runs; not thread-safe.
void WatchNestedCallsOfForTesting(const c10::OperatorName& op);

}  // namespace torchlens

#endif  // TORCHLENS_DISPATCH_TESTING_H_
