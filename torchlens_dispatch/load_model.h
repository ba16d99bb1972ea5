// Loading a TorchScript model file with errors that say what is wrong.
//
//   absl::StatusOr<torch::jit::Module> model = torchlens::LoadTorchScript("model.pt");
//   if (!model.ok()) { std::cerr << model.status() << "\n"; return 2; }
#ifndef TORCHLENS_DISPATCH_LOAD_MODEL_H_
#define TORCHLENS_DISPATCH_LOAD_MODEL_H_

#include <torch/script.h>

#include <string>

#include "absl/status/statusor.h"

namespace torchlens {

// kNotFound: no such file. kInvalidArgument: a directory, an empty file, or a file that is
// not a (complete) TorchScript archive. kPermissionDenied: unreadable. Messages name the
// path and say what a valid file is (one saved with torch.jit.save).
absl::StatusOr<torch::jit::Module> LoadTorchScript(const std::string& path);

}  // namespace torchlens

#endif  // TORCHLENS_DISPATCH_LOAD_MODEL_H_
