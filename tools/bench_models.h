// The bench's models: TorchScript files that tools/bench_models.py writes, and which rows
// of the bench each one gets.
#ifndef TORCHLENS_TOOLS_BENCH_MODELS_H_
#define TORCHLENS_TOOLS_BENCH_MODELS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace torchlens {

// Which rows a model gets.
enum class Rows {
  kAll,       // every configuration
  kCaptures,  // plain and captures (scaling and small-op models)
  kDisk,      // plain, capture without saved values, and capture to disk (large model)
};

struct BenchModel {
  std::string name;
  std::string file;
  bool train;
  std::vector<int64_t> input_shape;
  Rows rows;
};

// Every model, in the order the bench runs them.
const std::vector<BenchModel>& Models();

// The model named `name`, or null.
const BenchModel* FindModel(const std::string& name);

// Writes the models into `dir` with tools/bench_models.py unless they are all there.
absl::Status EnsureModels(const std::string& dir);

}  // namespace torchlens

#endif  // TORCHLENS_TOOLS_BENCH_MODELS_H_
