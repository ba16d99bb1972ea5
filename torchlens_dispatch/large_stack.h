// Running work on a thread with a stack of a given size.
//
// NOTE [Calls LibTorch compiles by recursion]
// torch::jit::load compiles a function's callees before the function, one nested call per
// level of calls, and a model's first run inlines them the same way: a few KB of stack per
// level. An archive whose functions each call the next, 1,500 deep, overflows the main
// thread's 8 MB (in Python's torch.jit.load too), far below
// what the archive checks bound. LoadTorchScript therefore loads on a thread with a 512 MiB
// stack and refuses archives of more than 4,096 functions and methods, so that any chain of
// them fits; the command-line tool runs on such a thread throughout, forward passes
// included. A library caller running such a deep model on a thread of its own needs as
// large a stack for its first forward, as LibTorch's own forward would there. That first
// forward inlines the chain in cubic time (6 s at 1,000 levels, 3 minutes at 3,000): the
// bound also keeps a crafted chain to minutes. TorchScript models have a few hundred
// functions (densenet121 281, the most of the zoo's; the depth bench's 1,000 levels load).
#ifndef TORCHLENS_DISPATCH_LARGE_STACK_H_
#define TORCHLENS_DISPATCH_LARGE_STACK_H_

#include <cstddef>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"

namespace torchlens {

inline constexpr size_t kLargeStackBytes = size_t{512} << 20;

// Runs `work` on a new thread whose stack holds `stack_bytes` (memory is committed only as
// the stack grows) and waits for it. An exception `work` throws is rethrown here.
// kResourceExhausted when no such thread can be started.
absl::Status RunOnLargeStack(absl::FunctionRef<void()> work, size_t stack_bytes = kLargeStackBytes);

}  // namespace torchlens

#endif  // TORCHLENS_DISPATCH_LARGE_STACK_H_
