#include "torchlens_dispatch/ops/exception_text.h"

#include <c10/util/Exception.h>
#include <torch/csrc/jit/frontend/error_report.h>
#include <torch/csrc/jit/frontend/source_range.h>

#include <algorithm>
#include <new>
#include <sstream>

// NOTE [ErrorReport::what() ends the process]
// torch::jit::ErrorReport (TorchScript compile errors, thrown while torch::jit::load
// compiles an archive's code) builds its message inside what(), which is noexcept. For
// each function being compiled when the error arose it highlights the calling line, and
// a highlight of archive code first looks up the original Python line in the archive's
// debug information (code/...py.debug_pkl), which LibTorch 1.13 unpickles only then.
// Corrupt debug information makes that lookup throw inside what(): std::terminate.
// Checking the debug records before loading (NOTE [Printing debug information]) covers
// the records torchlens can name, but LibTorch finds records by its own rules (its zip
// reader matches names case-insensitively, for one), so that check cannot be the only
// guard. Instead nothing in torchlens calls ErrorReport::what(): MessageOf builds the same
// text with each highlight guarded, and a highlight that throws is printed again from the
// serialized code alone, which needs no debug information.
//
// ErrorReport keeps its parts private; it befriends every specialization of its
// `operator<<` template, so the specialization for ErrorReportParts below reads them.

namespace torchlens {
namespace {

struct ErrorReportParts {
  std::string* message;  // the text what() would return
};

// `range` highlighted as SourceRange::highlight does; if that throws, the serialized code
// alone, with a line saying why.
void HighlightGuarded(const torch::jit::SourceRange& range, std::ostream& out) {
  std::ostringstream highlighted;
  try {
    range.highlight(highlighted);
    out << highlighted.str();
    return;
  } catch (const std::exception& e) {
    out << "(the original source of this line is unavailable: " << FirstLine(e) << ")\n";
  }
  try {
    // OwnedSourceRange copies the text without the debug information.
    std::ostringstream plain;
    torch::jit::OwnedSourceRange(range).highlight(plain);
    out << plain.str();
  } catch (const std::exception&) {
  }
}

}  // namespace
}  // namespace torchlens

namespace torch {
namespace jit {

// See NOTE [ErrorReport::what() ends the process]. The same text as what(): the message,
// the place, and the functions being compiled.
template <>
const ErrorReport& operator<< <torchlens::ErrorReportParts>(
    const ErrorReport& e, const torchlens::ErrorReportParts& parts) {
  std::ostringstream text;
  text << "\n" << e.ss.str() << ":\n";
  torchlens::HighlightGuarded(e.context, text);
  if (!e.error_stack.empty()) {
    for (auto call = e.error_stack.rbegin(); call + 1 != e.error_stack.rend(); ++call) {
      const Call& caller = *(call + 1);
      text << "'" << call->fn_name << "' is being compiled since it was called from '"
           << caller.fn_name << "'\n";
      torchlens::HighlightGuarded(caller.caller_range, text);
    }
  }
  *parts.message = text.str();
  return e;
}

}  // namespace jit
}  // namespace torch

namespace torchlens {

std::string MessageOf(const std::exception& e) {
  if (const auto* error = dynamic_cast<const c10::Error*>(&e)) {
    return error->what_without_backtrace();
  }
  if (const auto* report = dynamic_cast<const torch::jit::ErrorReport*>(&e)) {
    std::string message;
    *report << ErrorReportParts{&message};
    return message;
  }
  return e.what();
}

std::string FirstLine(const std::string& text) { return text.substr(0, text.find('\n')); }

std::string FirstLine(const std::exception& e) {
  const std::string message = MessageOf(e);
  // An ErrorReport's message starts with a newline.
  return FirstLine(message.substr(std::min(message.find_first_not_of('\n'), message.size())));
}

bool IsOutOfMemory(const std::exception& e) {
  if (dynamic_cast<const std::bad_alloc*>(&e) != nullptr) return true;
  const std::string text = MessageOf(e);
  for (const char* message :
       {"DefaultCPUAllocator: can't allocate memory", "C10 Out of Memory", "CUDA out of memory"}) {
    if (text.find(message) != std::string::npos) return true;
  }
  return false;
}

}  // namespace torchlens
