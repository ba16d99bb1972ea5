// The bench's scaling rows: how the per-op cost of capture grows with a model's depth.
#ifndef TORCHLENS_TOOLS_BENCH_SCALING_H_
#define TORCHLENS_TOOLS_BENCH_SCALING_H_

#include <nlohmann/json.hpp>
#include <string>

#include "tools/bench_models.h"

namespace torchlens {

// Per-op cost of `large` over `small` (the same layers, 10x as many), in blocks: each
// block runs one model's plain forward and capture (without saved values) alternately,
// warm (one discarded iteration), and keeps their medians; blocks alternate between the
// models, and each pair of blocks gives the ratios. The machine's slow drift over the run
// (other tenants of a shared L3) then moves both sides of a ratio alike, while each model
// is measured in the steady state a service runs it in. The median pair is reported.
// `rounds` pairs of blocks (0: 9). Null when a model cannot be loaded or captured.
nlohmann::json ScalingPair(const BenchModel& small, const BenchModel& large,
                           const std::string& models_dir, int rounds, bool consolidate_frees);

}  // namespace torchlens

#endif  // TORCHLENS_TOOLS_BENCH_SCALING_H_
