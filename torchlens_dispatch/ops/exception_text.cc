#include "torchlens_dispatch/ops/exception_text.h"

#include <c10/util/Exception.h>

#include <new>

namespace torchlens {

std::string FirstLine(const std::string& text) { return text.substr(0, text.find('\n')); }

std::string FirstLine(const std::exception& e) {
  if (const auto* error = dynamic_cast<const c10::Error*>(&e)) {
    return FirstLine(error->what_without_backtrace());
  }
  return FirstLine(std::string(e.what()));
}

bool IsOutOfMemory(const std::exception& e) {
  if (dynamic_cast<const std::bad_alloc*>(&e) != nullptr) return true;
  const auto* error = dynamic_cast<const c10::Error*>(&e);
  const std::string text = error != nullptr ? error->what_without_backtrace() : e.what();
  for (const char* message :
       {"DefaultCPUAllocator: can't allocate memory", "C10 Out of Memory", "CUDA out of memory"}) {
    if (text.find(message) != std::string::npos) return true;
  }
  return false;
}

}  // namespace torchlens
