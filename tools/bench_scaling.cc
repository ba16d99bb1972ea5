#include "tools/bench_scaling.h"

#include <torch/script.h>
#include <torch/torch.h>

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tools/bench_timing.h"
#include "torchlens_dispatch/capture.h"
#include "torchlens_dispatch/load_model.h"

namespace torchlens {

nlohmann::json ScalingPair(const BenchModel& small, const BenchModel& large,
                           const std::string& models_dir, int rounds, bool consolidate_frees) {
  struct Side {
    torch::jit::Module model;
    std::vector<c10::IValue> inputs;
    double ops = 0;
    double plain = 0, capture = 0;  // medians of this round's block, microseconds
  };
  CaptureOptions unsaved;
  unsaved.save_activations = false;
  torch::NoGradGuard no_grad;
  std::vector<Side> sides;
  for (const BenchModel* spec : {&small, &large}) {
    absl::StatusOr<torch::jit::Module> model =
        LoadTorchScript(absl::StrCat(models_dir, "/", spec->file));
    if (!model.ok()) return nullptr;
    model->train(spec->train);
    torch::manual_seed(0);
    Side side{*model, {torch::randn(spec->input_shape)}};
    absl::StatusOr<Trace> trace = TraceModule(side.model, side.inputs, unsaved);
    if (!trace.ok()) return nullptr;
    side.ops = static_cast<double>(trace->capture_stats().user_ops);
    sides.push_back(std::move(side));
  }
  std::vector<double> capture_ratios, plain_ratios, added_ratios;
  constexpr int kPerBlock = 11;
  if (rounds <= 0) rounds = 9;
  for (int round = -1; round < rounds; ++round) {  // one warm-up round
    for (Side& side : sides) {
      std::vector<double> plain, capture;
      for (int i = -1; i < kPerBlock; ++i) {
        const double p = MicrosOf([&] { side.model.forward(side.inputs); }, consolidate_frees);
        const double c = MicrosOf([&] { (void)TraceModule(side.model, side.inputs, unsaved); },
                                  consolidate_frees);
        if (i < 0) continue;
        plain.push_back(p);
        capture.push_back(c);
      }
      side.plain = Median(plain);
      side.capture = Median(capture);
    }
    if (round < 0) continue;
    const Side& a = sides[0];
    const Side& b = sides[1];
    capture_ratios.push_back((b.capture / b.ops) / (a.capture / a.ops));
    plain_ratios.push_back((b.plain / b.ops) / (a.plain / a.ops));
    added_ratios.push_back(((b.capture - b.plain) / b.ops) / ((a.capture - a.plain) / a.ops));
  }
  return {{"model", absl::StrCat(large.name, "/", small.name)},
          {"config", "scaling"},
          {"frees", consolidate_frees ? "each run's own" : "left to glibc"},
          {"capture_per_op_ratio", Median(capture_ratios)},
          {"plain_per_op_ratio", Median(plain_ratios)},
          {"added_per_op_ratio", Median(added_ratios)},
          {"repeats", rounds}};
}

}  // namespace torchlens
