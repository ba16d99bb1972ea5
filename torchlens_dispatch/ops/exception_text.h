// The part of a LibTorch exception's message worth showing in a one-line status.
#ifndef TORCHLENS_DISPATCH_OPS_EXCEPTION_TEXT_H_
#define TORCHLENS_DISPATCH_OPS_EXCEPTION_TEXT_H_

#include <exception>
#include <string>

namespace torchlens {

// The first line of `e`'s message, without LibTorch's C++ backtrace (c10::Error keeps
// the message proper apart from it).
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
