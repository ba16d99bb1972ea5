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

}  // namespace torchlens

#endif  // TORCHLENS_DISPATCH_OPS_EXCEPTION_TEXT_H_
