// Test-only hooks into the capture. Not for production code.
#ifndef TORCHLENS_DISPATCH_TESTING_H_
#define TORCHLENS_DISPATCH_TESTING_H_

namespace torchlens {

// On this thread, the capture's next `saves` saved values succeed and the one after
// fails as if out of memory (std::bad_alloc); -1 turns the simulation off.
void FailSavesAfterForTesting(int saves);

}  // namespace torchlens

#endif  // TORCHLENS_DISPATCH_TESTING_H_
