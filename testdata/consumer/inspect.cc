// Captures a small torch::nn model and prints what torchlens saw.
#include <torch/torch.h>

#include <iostream>

#include "graph/summary.h"
#include "torchlens_dispatch/capture.h"

int main() {
  torch::nn::Sequential net(torch::nn::Linear(4, 8), torch::nn::ReLU(), torch::nn::Linear(8, 2));
  const torch::Tensor x = torch::randn({1, 4});
  torchlens::CaptureGuard guard(*net);
  const torch::Tensor y = net->forward(x);
  absl::StatusOr<torchlens::Trace> trace = guard.Finish(y);
  if (!trace.ok()) {
    std::cerr << trace.status() << "\n";
    return 1;
  }
  std::cout << torchlens::FormatSummary(*trace);
  return 0;
}
