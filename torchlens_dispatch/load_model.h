// Loading a TorchScript model file with errors that say what is wrong.
//
//   absl::StatusOr<torch::jit::Module> model = torchlens::LoadTorchScript("model.pt");
//   if (!model.ok()) { std::cerr << model.status() << "\n"; return 2; }
//
// The file is read once (graph/file_io.h: regular files, and pipes such as `<(cat m.pt)`;
// never devices), checked (graph/archive_check.h: the zip container, every pickle
// program LibTorch would run, every parameter and buffer against its stored bytes), and
// only then given to `torch::jit::load`, from memory. The file thus needs memory for its
// own size while loading, beside the model.
#ifndef TORCHLENS_DISPATCH_LOAD_MODEL_H_
#define TORCHLENS_DISPATCH_LOAD_MODEL_H_

#include <torch/script.h>

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace torchlens {

// Errors name the path and say what a valid file is (one saved with torch.jit.save):
// kNotFound: no such file. kPermissionDenied: unreadable. kInvalidArgument: a directory
// or device, an empty file, a file that is not a complete, valid TorchScript archive
// (naming the record, opcode or tensor at fault), or code LibTorch cannot compile.
// kFailedPrecondition: the code uses an operator this process does not have (a
// `torchvision::` op without torchvision's library loaded, an `aten::` op of a newer
// PyTorch), naming it, where the code calls it, and what to load.
absl::StatusOr<torch::jit::Module> LoadTorchScript(const std::string& path);

// The same, from the bytes of a file (for tests and fuzzing); messages start with `name`.
absl::StatusOr<torch::jit::Module> LoadTorchScriptFromBytes(absl::string_view bytes,
                                                            absl::string_view name = "model");

}  // namespace torchlens

#endif  // TORCHLENS_DISPATCH_LOAD_MODEL_H_
