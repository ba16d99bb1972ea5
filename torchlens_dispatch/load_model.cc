#include "torchlens_dispatch/load_model.h"

#include <caffe2/serialize/read_adapter_interface.h>
#include <torch/csrc/jit/frontend/error_report.h>
#include <torch/csrc/jit/serialization/import.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "graph/archive_check.h"
#include "graph/file_io.h"
#include "torchlens_dispatch/large_stack.h"
#include "torchlens_dispatch/ops/exception_text.h"
#include "torchlens_dispatch/script_code_check.h"
#include "torchlens_dispatch/script_errors.h"

namespace torchlens {
namespace {

constexpr char kExpected[] = "a TorchScript archive saved with torch.jit.save";

// torch::jit::load reads the checked bytes, never the file again.
class BytesReader : public caffe2::serialize::ReadAdapterInterface {
 public:
  explicit BytesReader(absl::string_view bytes) : bytes_(bytes) {}
  size_t size() const override { return bytes_.size(); }
  size_t read(uint64_t pos, void* buf, size_t n, const char*) const override {
    if (pos >= bytes_.size()) return 0;
    const size_t available = std::min<uint64_t>(n, bytes_.size() - pos);
    std::memcpy(buf, bytes_.data() + pos, available);
    return available;
  }

 private:
  absl::string_view bytes_;
};

// What to load for an operator LibTorch does not have.
std::string MissingOperatorHint(absl::string_view cause) {
  absl::string_view op = cause;
  absl::ConsumePrefix(&op, "Unknown builtin op: ");
  absl::ConsumeSuffix(&op, ".");
  const absl::string_view ns = op.substr(0, op.find("::"));
  if (ns == "aten" || ns == "prim") {
    return absl::StrCat("this LibTorch (1.13) has no ", op,
                        ": the model was saved by a newer PyTorch; export it with PyTorch 1.13 "
                        "or replace the operator");
  }
  return absl::StrCat("load the library that registers ", ns,
                      ":: operators before loading the "
                      "model (for torchvision::, torchvision's _C.so: dlopen it or link it)");
}

}  // namespace

absl::StatusOr<torch::jit::Module> LoadTorchScriptFromBytes(absl::string_view bytes,
                                                            absl::string_view name) {
  // See NOTE [Untrusted archives].
  absl::StatusOr<CheckedArchive> checked = CheckTorchArchive(bytes, ArchiveKind::kTorchScript);
  if (!checked.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " is ", checked.status().message(), "; expected ", kExpected));
  }
  // NOTE [Code LibTorch 1.13 crashes on], NOTE [Printing debug information]
  int64_t functions = 0;
  for (const ZipArchive::Entry& entry : checked->zip.entries()) {
    absl::string_view record = entry.name;
    if (!absl::ConsumePrefix(&record, checked->zip.prefix())) {
      // torch.jit.save writes every record under the archive's folder. A record outside it
      // escapes the checks below, yet LibTorch may still read it (the model_archive fuzz
      // target found a debug record renamed in the central directory only, whose bytes
      // LibTorch unpickled inside ErrorReport::what() and ended the process).
      return absl::InvalidArgumentError(
          absl::StrCat(name, " has a record outside its archive folder '", checked->zip.prefix(),
                       "': '", entry.name, "'; expected ", kExpected));
    }
    const ScriptRecord kind = ScriptRecordKind(record);
    const bool code = kind == ScriptRecord::kCode, debug = kind == ScriptRecord::kDebugInfo;
    if (!code && !debug) continue;
    absl::StatusOr<std::string> bytes = checked->zip.Read(entry);
    absl::Status s = !bytes.ok() ? bytes.status()
                     : code      ? CheckScriptCode(*bytes, std::string(record), &functions)
                                 : CheckDebugInfo(*bytes, std::string(record));
    if (!s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " has code LibTorch cannot load: ", s.message()));
    }
  }
  // See NOTE [Calls LibTorch compiles by recursion].
  constexpr int64_t kMaxFunctions = 4096;
  if (functions > kMaxFunctions) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, " defines ", functions, " functions and methods, more than ", kMaxFunctions,
        ", which LibTorch may compile one nested call deep each (NOTE [Calls LibTorch compiles "
        "by recursion])"));
  }
  try {
    torch::jit::Module module;
    if (absl::Status started = RunOnLargeStack(
            [&] { module = torch::jit::load(std::make_shared<BytesReader>(bytes)); });
        !started.ok()) {
      return started;
    }
    return module;
  } catch (const torch::jit::ErrorReport& e) {  // compiling the archive's code
    // MessageOf, never e.what(): NOTE [ErrorReport::what() ends the process].
    const ScriptError error = ParseCompileError(MessageOf(e));
    if (absl::StartsWith(error.cause, "Unknown builtin op: ")) {
      return absl::FailedPreconditionError(
          absl::StrCat(name, " uses an operator this process does not have: ", error.OneLine(),
                       "; ", MissingOperatorHint(error.cause)));
    }
    return absl::InvalidArgumentError(
        absl::StrCat(name, " has code LibTorch cannot compile: ", error.OneLine()));
  } catch (const std::exception& e) {
    const ScriptError error = ParseInterpreterError(MessageOf(e));
    return absl::InvalidArgumentError(absl::StrCat(
        name, " could not be loaded by LibTorch: ", error.OneLine(), "; expected ", kExpected));
  }
}

absl::StatusOr<torch::jit::Module> LoadTorchScript(const std::string& path) {
  absl::StatusOr<FileBytes> bytes = ReadFileBytes(path, {"model file", kExpected});
  if (!bytes.ok()) return bytes.status();
  return LoadTorchScriptFromBytes(bytes->view(), absl::StrCat("model file '", path, "'"));
}

}  // namespace torchlens
