// ValidateGradients: passes on the gradient test models (tools/gen_testdata_grads.py) and
// models with residual connections, loops and BatchNorm, fails on a tampered gradient.
#include <torch/script.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testdata/testdata.h"
#include "torchlens_dispatch/capture.h"
#include "validation/validate.h"

namespace torchlens {
namespace {

using ::testing::HasSubstr;

at::Tensor SumOfOutputs(const c10::IValue& outputs) {
  if (outputs.isTensor()) return outputs.toTensor().sum();
  at::Tensor loss = torch::zeros({});
  for (const c10::IValue& value : outputs.toTupleRef().elements()) {
    loss = loss + value.toTensor().sum();
  }
  return loss;
}

// A capture with gradients of testdata model `name` in training or eval mode, after a
// backward of the sum of its outputs.
Trace CapturedWithGradients(const std::string& name, bool train) {
  torch::jit::Module model = testdata::LoadModel(name);
  model.train(train);
  CaptureOptions options;
  options.save_grads = true;
  c10::IValue outputs;
  absl::StatusOr<Trace> trace =
      TraceModule(model, testdata::Expected(name).inputs(), options, &outputs);
  EXPECT_TRUE(trace.ok()) << trace.status();
  SumOfOutputs(outputs).backward();
  return trace.ok() ? *std::move(trace) : Trace();
}

TEST(ValidateGradientsTest, PassesOnTheGradientModelsAndOthers) {
  struct Case {
    std::string name;
    bool train;
    int checked;  // values whose gradient is checked
  };
  for (const Case& c : std::vector<Case>{{"grad_mlp", false, 10},
                                         {"grad_convbn_train", true, 11},
                                         {"grad_recurrent", false, 11},
                                         {"grad_shared_op", false, 5},
                                         {"grad_detached", false, 6},
                                         {"grad_inplace", false, 7},
                                         {"demo", true, 0},
                                         {"demo", false, 0},
                                         {"loop_reuse", false, 0},
                                         {"call_twice", false, 0},
                                         {"counter_cell", false, 0},
                                         {"bn_loop_train", true, 0},
                                         {"dropout_train", true, 0}}) {
    SCOPED_TRACE(c.name);
    const Trace trace = CapturedWithGradients(c.name, c.train);
    absl::StatusOr<ValidationReport> report = ValidateGradients(trace);
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_TRUE(report->passed) << absl::StrJoin(report->failures, "\n");
    EXPECT_TRUE(report->unproved.empty()) << absl::StrJoin(report->unproved, "\n");
    if (c.checked > 0) {
      EXPECT_EQ(report->ops_checked, c.checked);  // ops and parameters; not the outputs
    }
    EXPECT_GT(report->ops_checked, 0);
  }
}

TEST(ValidateGradientsTest, OutputsAreNotChecked) {
  absl::StatusOr<ValidationReport> report =
      ValidateGradients(CapturedWithGradients("grad_mlp", false));
  ASSERT_TRUE(report.ok());
  EXPECT_THAT(report->not_checked, ::testing::ElementsAre("linear_3_5:1"));
}

TEST(ValidateGradientsTest, FailsOnATamperedGradient) {
  for (const char* label : {"relu_1_2:1", "tanh_1_4:1"}) {
    SCOPED_TRACE(label);
    const Trace trace = CapturedWithGradients("grad_mlp", false);
    const Op* op = *trace.Find(label);
    op->grad.mul_(1.0001);  // in place: the trace's own tensor
    absl::StatusOr<ValidationReport> report = ValidateGradients(trace);
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_FALSE(report->passed);
    // It, and its parents, whose gradients its backward gave.
    EXPECT_THAT(absl::StrJoin(report->failures, "\n"), HasSubstr(absl::StrCat(label, ": ")));
  }
  // A parameter's.
  const Trace trace = CapturedWithGradients("grad_shared_op", false);
  trace.param_grads().at("fc.weight").add_(1e-3);
  absl::StatusOr<ValidationReport> report = ValidateGradients(trace);
  ASSERT_TRUE(report.ok());
  EXPECT_FALSE(report->passed);
  EXPECT_THAT(absl::StrJoin(report->failures, "\n"), HasSubstr("parameter fc.weight"));
}

TEST(ValidateGradientsTest, NeedsGradients) {
  torch::jit::Module model = testdata::LoadModel("grad_mlp");
  absl::StatusOr<Trace> trace = TraceModule(model, testdata::Expected("grad_mlp").inputs());
  ASSERT_TRUE(trace.ok());
  absl::StatusOr<ValidationReport> report = ValidateGradients(*trace);
  EXPECT_EQ(report.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(report.status().message(), HasSubstr("save_grads"));
}

// The bench's MLP-50 (50 Linear(16) + ReLU layers), built with the C++ frontend.
TEST(ValidateGradientsTest, PassesOnADeepMlp) {
  torch::manual_seed(0);
  torch::nn::Sequential mlp;
  for (int i = 0; i < 50; ++i) {
    mlp->push_back(torch::nn::Linear(16, 16));
    mlp->push_back(torch::nn::ReLU());
  }
  CaptureOptions options;
  options.save_grads = true;
  CaptureGuard guard(*mlp, options);
  at::Tensor out = mlp->forward(torch::randn({1, 16}));
  absl::StatusOr<Trace> trace = guard.Finish(out);
  ASSERT_TRUE(trace.ok());
  out.sum().backward();
  absl::StatusOr<ValidationReport> report = ValidateGradients(*trace);
  ASSERT_TRUE(report.ok());
  EXPECT_TRUE(report->passed) << absl::StrJoin(report->failures, "\n");
  EXPECT_GE(report->ops_checked, 199);  // 150 ops (t, addmm, relu) and 100 parameters, less
}

}  // namespace
}  // namespace torchlens
