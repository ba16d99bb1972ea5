// The torchlens benchmark: what capture, validation and interventions cost, as ratios to
// the plain forward pass measured in the same process and run.
//
//   tools/bazelw run -c opt //tools:bench                       # all models, 1 thread
//   tools/bazelw run -c opt //tools:bench -- --models mlp50 --threads 2 --json out.json
//   tools/bazelw run -c opt //tools:bench -- --models mlp50 --configs do_last_op  # profiling
//   tools/bazelw run -c opt //tools:bench -- --backward --models mlp50,resnet18_train
//
// For each model, every configuration runs interleaved with the others (plain forward,
// capture without saved values, full capture, ValidateForwardPass, Do on the last op, Do on
// the first op), after warm-up; the table reports medians. Everything runs under
// NoGradGuard, at 1 intra-op thread unless --threads says otherwise. Models are TorchScript
// files written by tools/bench_models.py (run automatically into --models_dir when missing).
//
// glibc's malloc adapts its mmap and trim thresholds to the allocation pattern, which
// skews small-model timings 2-4x from run to run; the bench pins both (mallopt) first.
// Every timed run also pays for its own frees: see NOTE [Each run pays for its own frees].
//
// The bench's parts: bench_models.h (the models), bench_forward.h (the forward rows),
// bench_backward.h (the gradient rows), bench_scaling.h (the scaling rows), bench_table.h
// (the printed tables).
#include <ATen/Parallel.h>
#include <malloc.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "tools/bench_backward.h"
#include "tools/bench_forward.h"
#include "tools/bench_models.h"
#include "tools/bench_scaling.h"
#include "tools/bench_table.h"
#include "tools/flag_parser.h"
#include "torchlens_dispatch/load_model.h"

namespace torchlens {
namespace {

struct Options {
  std::string models_dir;
  std::vector<std::string> only;
  std::vector<std::string> configs;  // --configs: these rows and "plain" (all when empty)
  int threads = 1;
  int repeats = 0;  // 0: chosen per model
  std::string json_file;
  bool backward = false;  // --backward: the gradient rows (bench_backward.h) only
};

// Whether --models leaves `name` in (all models when it is not given).
bool Selected(const Options& options, const std::string& name) {
  return options.only.empty() ||
         std::find(options.only.begin(), options.only.end(), name) != options.only.end();
}

absl::StatusOr<Options> ParseOptions(int argc, char** argv) {
  Options options;
  const char* home = std::getenv("HOME");
  options.models_dir = absl::StrCat(home ? home : "/tmp", "/.cache/torchlens/bench-models");
  FlagParser flags;
  flags.String("models_dir", &options.models_dir);
  flags.List("models", &options.only);
  flags.List("configs", &options.configs);
  flags.Int("threads", &options.threads, 1);
  flags.Int("repeats", &options.repeats, 1);
  flags.String("json", &options.json_file);
  flags.Switch("backward", &options.backward);
  if (absl::Status parsed = flags.Parse(argc, argv); !parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(parsed.message(),
                     "; flags: --models a,b --configs a,b --threads "
                     "N --repeats N --json FILE --models_dir DIR --backward"));
  }
  return options;
}

}  // namespace
}  // namespace torchlens

int main(int argc, char** argv) {
  using namespace torchlens;
  // See the file comment: pin glibc's adaptive thresholds.
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  absl::StatusOr<Options> options = ParseOptions(argc, argv);
  if (!options.ok()) {
    std::cerr << "bench: " << options.status().message() << "\n";
    return 2;
  }
  options->models_dir = UserPath(options->models_dir);
  if (absl::Status s = EnsureModels(options->models_dir); !s.ok()) {
    std::cerr << "bench: " << s.message() << "\n";
    return 2;
  }
  at::set_num_threads(options->threads);
#ifndef __OPTIMIZE__
  // `bazel-bin/tools/bench` after a `bazel test` is the fastbuild binary: torchlens' own
  // code at -O0 against an optimized LibTorch, which makes capture look slow and its
  // scaling look flat.
  std::cout << "WARNING: this bench was built without optimization, so its ratios do not "
               "describe torchlens; run tools/bazelw run -c opt //tools:bench\n";
#endif
  std::cout << "torchlens bench: " << options->threads << " intra-op thread(s), medians; "
            << "malloc thresholds pinned (M_MMAP_THRESHOLD 64 MiB, M_TRIM_THRESHOLD 256 MiB), "
               "each timed run consolidates its own frees\n";
  nlohmann::json all = nlohmann::json::array();
  if (options->backward) {
    // Forward and backward, with and without save_grads (bench_backward.h).
    for (const BenchModel& model : Models()) {
      if (!Selected(*options, model.name) || model.rows != Rows::kAll) continue;
      absl::StatusOr<torch::jit::Module> loaded =
          LoadTorchScript(absl::StrCat(options->models_dir, "/", model.file));
      if (!loaded.ok()) return 1;
      loaded->train(model.train);
      torch::manual_seed(0);
      nlohmann::json rows = BenchBackward(model.name, *loaded, {torch::randn(model.input_shape)},
                                          options->repeats, options->configs);
      if (rows.is_null()) return 1;
      PrintTable(rows);
      PrintGradientVerdicts(model.name, rows);
      std::cout.flush();
      for (nlohmann::json& row : rows) all.push_back(row);
    }
    if (!options->json_file.empty()) {
      std::ofstream(UserPath(options->json_file)) << all.dump(2) << "\n";
    }
    return 0;
  }
  for (const BenchModel& model : Models()) {
    if (!Selected(*options, model.name)) continue;
    nlohmann::json rows =
        BenchForward(model, options->models_dir, options->repeats, options->configs);
    if (rows.is_null()) return 1;
    PrintTable(rows);
    std::cout.flush();
    for (nlohmann::json& row : rows) all.push_back(row);
  }
  // Scaling: per-op cost at 2,000 layers against 200. The tied pair shares one layer's
  // weights, so that its memory does not grow with its depth: it separates the capture's
  // own scaling from the model's leaving the cache (README "Performance").
  // Both ways of charging glibc's deferred frees: NOTE [Each run pays for its own frees].
  for (const bool consolidate_frees : {true, false}) {
    for (const auto& [small, large] : {std::pair<std::string, std::string>{"mlp200", "mlp2000"},
                                       {"mlp200_tied", "mlp2000_tied"}}) {
      if (!Selected(*options, large)) continue;
      nlohmann::json row = ScalingPair(*FindModel(small), *FindModel(large), options->models_dir,
                                       options->repeats, consolidate_frees);
      if (row.is_null()) {
        std::cerr << "bench: could not measure " << large << " against " << small << "\n";
        return 1;
      }
      PrintScalingRow(row);
      all.push_back(row);
    }
  }
  if (!options->json_file.empty()) {
    std::ofstream(UserPath(options->json_file)) << all.dump(2) << "\n";
  }
  return 0;
}
