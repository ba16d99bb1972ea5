#include "tools/bench_models.h"

#include <cstdlib>
#include <fstream>
#include <iostream>

#include "absl/strings/str_cat.h"

namespace torchlens {

const std::vector<BenchModel>& Models() {
  static const std::vector<BenchModel> models = {
      {"mlp50", "mlp50.pt", false, {1, 16}, Rows::kAll},
      {"resnet18_eval", "resnet18.pt", false, {1, 3, 224, 224}, Rows::kAll},
      {"resnet18_train", "resnet18.pt", true, {1, 3, 224, 224}, Rows::kAll},
      {"recurrent100", "recurrent.pt", false, {1, 32}, Rows::kAll},
      {"transformer", "transformer.pt", false, {1, 16, 64}, Rows::kAll},
      // Many small ops (issue 21's small-op models): capture rows only.
      {"shufflenet_v2_x1_0", "shufflenet_v2_x1_0.pt", false, {1, 3, 224, 224}, Rows::kCaptures},
      {"mobilenet_v2", "mobilenet_v2.pt", false, {1, 3, 224, 224}, Rows::kCaptures},
      {"mlp200", "mlp200.pt", false, {1, 16}, Rows::kCaptures},
      {"mlp2000", "mlp2000.pt", false, {1, 16}, Rows::kCaptures},
      {"mlp200_tied", "mlp200_tied.pt", false, {1, 16}, Rows::kCaptures},
      {"mlp2000_tied", "mlp2000_tied.pt", false, {1, 16}, Rows::kCaptures},
      // Saved values of over 4 GB (issue 19), captured to disk only: --models resnet152_b32.
      {"resnet152_b32", "resnet152.pt", false, {32, 3, 224, 224}, Rows::kDisk},
  };
  return models;
}

const BenchModel* FindModel(const std::string& name) {
  for (const BenchModel& model : Models()) {
    if (model.name == name) return &model;
  }
  return nullptr;
}

absl::Status EnsureModels(const std::string& dir) {
  bool missing = false;
  for (const BenchModel& model : Models()) {
    missing = missing || !std::ifstream(absl::StrCat(dir, "/", model.file)).good();
  }
  if (!missing) return absl::OkStatus();
  std::cerr << "bench: writing models into " << dir << " (tools/bench_models.py)\n";
  const std::string command = absl::StrCat("/usr/bin/python3 tools/bench_models.py '", dir, "'");
  if (std::system(command.c_str()) != 0) {
    return absl::InternalError(
        absl::StrCat("`", command,
                     "` failed; python3-torch and "
                     "python3-torchvision are needed (tools/bazelw installs them)"));
  }
  return absl::OkStatus();
}

}  // namespace torchlens
