// Deep nesting, phase by phase: which part of tracing a model nested N modules deep is
// LibTorch's and which is torchlens' (README "Reliability").
//
//   tools/bazelw run -c opt //tools:depth_bench -- 100 200 400 1000
//
// For each depth it builds, in C++, N modules each wrapping the next (`relu(self.inner.forward(x))`
// around a Linear), saves it to memory and measures the process CPU time and the growth
// of resident memory of each phase: LibTorch's `torch::jit::load`, torchlens' layout walk
// (LayoutOf), the first run of the private plan (RunUnoptimized: inlining and site tables
// are torchlens', building the interpreter's code from the graph is LibTorch's), a
// capture (TraceModule) and the summary.
#include <torch/script.h>
#include <torch/torch.h>

#include <ctime>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "absl/strings/numbers.h"
#include "graph/summary.h"
#include "tools/nested_modules.h"
#include "torchlens_dispatch/capture.h"
#include "torchlens_dispatch/model_layout.h"
#include "torchlens_dispatch/script_runner.h"

namespace {

double CpuSeconds() {
  timespec now;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
}

double ResidentMb() {
  std::ifstream statm("/proc/self/statm");
  long size = 0, resident = 0;
  statm >> size >> resident;
  return static_cast<double>(resident) * 4096 / (1 << 20);
}

}  // namespace

int main(int argc, char** argv) {
  std::cout << "depth | phase | CPU s | RSS growth MB\n";
  for (int i = 1; i < argc; ++i) {
    int depth = 0;
    if (!absl::SimpleAtoi(argv[i], &depth) || depth < 1) {
      std::cerr << "depth_bench: expected depths such as 100 200 400\n";
      return 2;
    }
    std::stringstream saved;
    torchlens::NestedModules(depth, torch::randn({2, 2})).save(saved);
    double cpu = CpuSeconds(), rss = ResidentMb();
    auto phase = [&](const char* name) {
      const double now_cpu = CpuSeconds(), now_rss = ResidentMb();
      std::cout << depth << " | " << name << " | " << now_cpu - cpu << " | " << now_rss - rss
                << "\n";
      cpu = now_cpu;
      rss = now_rss;
    };
    torch::jit::Module model = torch::jit::load(saved);
    phase("load (LibTorch)");
    model.eval();
    (void)torchlens::LayoutOf(model);
    phase("layout");
    const at::Tensor x = torch::randn({1, 2});
    (void)torchlens::RunUnoptimized(model, {x});
    phase("private plan, first run");
    absl::StatusOr<torchlens::Trace> trace = torchlens::TraceModule(model, {x});
    if (!trace.ok()) {
      std::cerr << "depth_bench: " << trace.status() << "\n";
      return 2;
    }
    phase("capture");
    (void)torchlens::FormatSummary(*trace);
    phase("summary");
  }
  return 0;
}
