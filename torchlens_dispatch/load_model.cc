#include "torchlens_dispatch/load_model.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace torchlens {
namespace {

constexpr char kExpected[] = "expected a TorchScript archive saved with torch.jit.save";

std::string FirstLine(const std::string& text) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::StripAsciiWhitespace(line).empty()) return std::string(absl::StripAsciiWhitespace(line));
  }
  return text;
}

}  // namespace

absl::StatusOr<torch::jit::Module> LoadTorchScript(const std::string& path) {
  struct stat info;
  if (::stat(path.c_str(), &info) != 0) {
    if (errno == ENOENT) {
      return absl::NotFoundError(absl::StrCat("model file '", path, "' does not exist"));
    }
    return absl::InvalidArgumentError(
        absl::StrCat("cannot access model file '", path, "': ", std::strerror(errno)));
  }
  if (S_ISDIR(info.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("model path '", path, "' is a directory; ", kExpected));
  }
  if (info.st_size == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model file '", path, "' is empty (0 bytes); ", kExpected));
  }
  if (!std::ifstream(path, std::ios::binary).good()) {
    return absl::PermissionDeniedError(absl::StrCat("cannot read model file '", path, "'"));
  }
  try {
    return torch::jit::load(path);
  } catch (const c10::Error& e) {
    const std::string reason = FirstLine(e.what_without_backtrace());
    if (absl::StrContains(reason, "Unknown builtin op")) {
      return absl::FailedPreconditionError(absl::StrCat(
          "model file '", path, "' uses an operator this process does not have (", reason,
          "); load the library that registers it first (e.g. torchvision's _C.so for "
          "torchvision::nms)"));
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "model file '", path, "' is not a complete TorchScript archive (", reason, "); ",
        kExpected));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("model file '", path,
                                                   "' is not a complete TorchScript archive (",
                                                   FirstLine(e.what()), "); ", kExpected));
  }
}

}  // namespace torchlens
