// Uses torchlens from another Bazel workspace through its public headers and //:torchlens.
#include <torch/torch.h>

#include <string>

#include "graph/render.h"
#include "graph/trace.h"
#include "gtest/gtest.h"
#include "torchlens_dispatch/capture.h"
#include "validation/intervene.h"
#include "validation/validate.h"

namespace {

TEST(ConsumerTest, CaptureValidateInterveneRender) {
  torch::manual_seed(0);
  torch::nn::Sequential net(torch::nn::Linear(3, 3), torch::nn::ReLU());
  const torch::Tensor x = torch::randn({2, 3});
  torchlens::CaptureGuard guard(*net);
  const torch::Tensor y = net->forward(x);
  absl::StatusOr<torchlens::Trace> trace = guard.Finish(y);
  ASSERT_TRUE(trace.ok()) << trace.status();
  // The C++ frontend's Linear runs t + addmm; the relu is the fourth node.
  absl::StatusOr<const torchlens::Op*> relu = trace->Find("relu_1_3");
  ASSERT_TRUE(relu.ok()) << relu.status();
  EXPECT_TRUE(torch::equal((*relu)->out, y));
  EXPECT_TRUE(torch::equal((*relu)->out, torch::relu(net[0]->as<torch::nn::Linear>()->forward(x))));

  absl::StatusOr<torchlens::ValidationReport> report = torchlens::ValidateForwardPass(*trace);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->passed);

  absl::StatusOr<torchlens::DoResult> edited =
      torchlens::Do(*trace, {torchlens::Edit{"input_1", torch::zeros({2, 3})}});
  ASSERT_TRUE(edited.ok()) << edited.status();
  const torch::Tensor bias = net[0]->as<torch::nn::Linear>()->bias;
  EXPECT_TRUE(
      torch::allclose((*edited->trace.Find("output_1"))->out, torch::relu(bias).expand({2, 3})));

  const std::string dot = torchlens::RenderDot(*trace);
  EXPECT_NE(dot.find("relu_1_3:1"), std::string::npos);
}

}  // namespace
