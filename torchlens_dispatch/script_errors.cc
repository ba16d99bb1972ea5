#include "torchlens_dispatch/script_errors.h"

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace torchlens {
namespace {

constexpr absl::string_view kMarker = "<--- HERE";

// One frame of a TorchScript traceback:
//     File "code/__torch__.py", line 14, in forward
//       ...context...
//       return torch.linear(input, weight, bias)
//              ~~~~~~~~~~~~ <--- HERE
struct Frame {
  std::string location;   // "code/__torch__.py:14: return torch.linear(input, weight, bias)"
  bool original = false;  // in the "original code" traceback
};

bool IsFileLine(absl::string_view line, std::string* file, std::string* number) {
  line = absl::StripLeadingAsciiWhitespace(line);
  if (!absl::ConsumePrefix(&line, "File \"")) return false;
  const size_t quote = line.find('"');
  if (quote == absl::string_view::npos) return false;
  *file = std::string(line.substr(0, quote));
  line.remove_prefix(quote + 1);
  if (!absl::ConsumePrefix(&line, ", line ")) return false;
  const size_t end = line.find_first_not_of("0123456789");
  *number = std::string(line.substr(0, end));
  return !number->empty();
}

std::vector<Frame> Frames(const std::vector<absl::string_view>& lines) {
  std::vector<Frame> frames;
  bool original = false;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (absl::StrContains(lines[i], "Traceback of TorchScript")) {
      original = absl::StrContains(lines[i], "original code");
    }
    std::string file, number;
    if (!IsFileLine(lines[i], &file, &number)) continue;
    // The statement is the line above the frame's marker; a place at the end of the
    // file has no marker.
    std::string location = absl::StrCat(file, ":", number);
    for (size_t j = i + 1; j < lines.size(); ++j) {
      std::string next_file, next_number;
      if (IsFileLine(lines[j], &next_file, &next_number)) break;
      if (!absl::StrContains(lines[j], kMarker)) continue;
      if (j > i + 1) absl::StrAppend(&location, ": ", absl::StripAsciiWhitespace(lines[j - 1]));
      break;
    }
    frames.push_back(Frame{std::move(location), original});
  }
  return frames;
}

std::string WithoutGenericPrefix(absl::string_view cause) {
  cause = absl::StripAsciiWhitespace(cause);
  absl::ConsumePrefix(&cause, "builtins.");
  absl::ConsumePrefix(&cause, "RuntimeError: ");
  return std::string(cause);
}

std::string FirstLine(const std::vector<absl::string_view>& lines) {
  for (absl::string_view line : lines) {
    if (!absl::StripAsciiWhitespace(line).empty())
      return std::string(absl::StripAsciiWhitespace(line));
  }
  return "";
}

}  // namespace

std::string ScriptError::OneLine() const {
  return location.empty() ? cause : absl::StrCat(cause, " (at ", location, ")");
}

ScriptError ParseInterpreterError(absl::string_view message) {
  const std::vector<absl::string_view> lines = absl::StrSplit(message, '\n');
  ScriptError error;
  size_t last_marker = lines.size();
  for (size_t i = 0; i < lines.size(); ++i) {
    if (absl::StrContains(lines[i], kMarker)) last_marker = i;
  }
  if (last_marker == lines.size()) {
    error.cause = WithoutGenericPrefix(FirstLine(lines));
    return error;
  }
  // After the last frame: the rest of its context (indented), then the cause.
  for (size_t i = last_marker + 1; i < lines.size(); ++i) {
    if (lines[i].empty() || absl::ascii_isspace(lines[i][0])) continue;
    error.cause = WithoutGenericPrefix(lines[i]);
    break;
  }
  if (error.cause.empty()) error.cause = WithoutGenericPrefix(FirstLine(lines));
  bool error_from_original = false;
  // The innermost frame is the last; the original code's, when the archive has it.
  for (const Frame& frame : Frames(lines)) {
    if (frame.original || error.location.empty() || !error_from_original) {
      error.location = frame.location;
      error_from_original = frame.original;
    }
  }
  return error;
}

ScriptError ParseCompileError(absl::string_view message) {
  const std::vector<absl::string_view> lines = absl::StrSplit(message, '\n');
  ScriptError error;
  error.cause = FirstLine(lines);
  const std::vector<Frame> frames = Frames(lines);
  if (!frames.empty()) error.location = frames.front().location;
  return error;
}

}  // namespace torchlens
