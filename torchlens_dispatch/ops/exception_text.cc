#include "torchlens_dispatch/ops/exception_text.h"

#include <c10/util/Exception.h>

namespace torchlens {

std::string FirstLine(const std::string& text) { return text.substr(0, text.find('\n')); }

std::string FirstLine(const std::exception& e) {
  if (const auto* error = dynamic_cast<const c10::Error*>(&e)) {
    return FirstLine(error->what_without_backtrace());
  }
  return FirstLine(std::string(e.what()));
}

}  // namespace torchlens
