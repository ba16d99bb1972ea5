// The part of a LibTorch exception's message worth showing in a one-line status.
#ifndef TORCHLENS_DISPATCH_OPS_EXCEPTION_TEXT_H_
#define TORCHLENS_DISPATCH_OPS_EXCEPTION_TEXT_H_

#include <exception>
#include <string>

namespace torchlens {

// `e`'s whole message, safe to call on any exception LibTorch throws:
//   - a c10::Error gives its message without LibTorch's C++ backtrace;
//   - a torch::jit::ErrorReport gives what its what() would, built without calling it
//     (NOTE [ErrorReport::what() ends the process]);
//   - anything else gives what().
// Call this, never what(), on an exception that may be a torch::jit::ErrorReport.
std::string MessageOf(const std::exception& e);

// The first line of MessageOf(e).
std::string FirstLine(const std::exception& e);

// The first line of `text`.
std::string FirstLine(const std::string& text);

// Whether `e` reports running out of memory: std::bad_alloc, or an error whose text holds
// one of the messages LibTorch 1.13's allocators throw ("DefaultCPUAllocator: can't
// allocate memory", "C10 Out of Memory", "CUDA out of memory"), also when the TorchScript
// interpreter wrapped it. Not any message that merely mentions allocating.
bool IsOutOfMemory(const std::exception& e);

}  // namespace torchlens

#endif  // TORCHLENS_DISPATCH_OPS_EXCEPTION_TEXT_H_
