// Do(): edits, cones of effect, buffer state threading and its gaps. Expected values are
// hand computations from the saved parameters.
#include "validation/intervene.h"

#include <torch/script.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testdata/testdata.h"
#include "testdata/trace_testing.h"
#include "torchlens_dispatch/capture.h"
#include "validation/validate.h"

namespace torchlens {
namespace {

using ::torchlens::testing_util::Capture;
using ::torchlens::testing_util::Get;

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// Every saved tensor of a trace, cloned, to check later that nothing was written.
std::vector<at::Tensor> SavedTensors(const Trace& trace) {
  std::vector<at::Tensor> tensors;
  for (const Op& op : trace.ops()) {
    for (const at::Tensor& t : op.outs) tensors.push_back(t);
    for (const c10::IValue& arg : op.creation_args) {
      if (arg.isTensor() && arg.toTensor().defined()) tensors.push_back(arg.toTensor());
    }
  }
  return tensors;
}

std::vector<at::Tensor> Clones(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> clones;
  for (const at::Tensor& t : tensors) clones.push_back(t.clone());
  return clones;
}

void ExpectUnchanged(const std::vector<at::Tensor>& now, const std::vector<at::Tensor>& before) {
  ASSERT_EQ(now.size(), before.size());
  for (size_t i = 0; i < now.size(); ++i) EXPECT_TRUE(at::equal(now[i], before[i])) << i;
}

// The example: b takes 1, 2, 3 while h = relu(cell(h) + b) runs three times.
TEST(DoTest, EditedBufferVersionThreadsThroughLaterWrites) {
  torch::jit::Module model = testdata::LoadModel("counter_cell");
  const Trace trace = Capture("counter_cell");
  const Buffer& b = trace.buffers().at("b");
  ASSERT_EQ(b.versions.size(), 4u);
  for (int v = 1; v <= 4; ++v) EXPECT_TRUE(at::equal(*b.value_at(v), at::full({4}, v - 1.0)));

  const std::vector<at::Tensor> saved = SavedTensors(trace);
  const std::vector<at::Tensor> before = Clones(saved);
  const at::Tensor seven = at::full({4}, 7.0);
  const at::Tensor seven_copy = seven.clone();
  absl::StatusOr<DoResult> result = Do(trace, {Edit{"b:1", seven}});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_THAT(result->warnings, IsEmpty());
  const Buffer& forked = result->trace.buffers().at("b");
  for (int v = 1; v <= 4; ++v) {
    EXPECT_TRUE(at::equal(*forked.value_at(v), at::full({4}, 6.0 + v))) << v;  // 7, 8, 9, 10
  }
  // relu outputs by hand with b = 8, 9, 10 after each add_.
  const at::Tensor w = model.attr("cell").toModule().attr("weight").toTensor().detach();
  const at::Tensor c = model.attr("cell").toModule().attr("bias").toTensor().detach();
  at::Tensor h = testdata::Expected("counter_cell").input(0);
  for (int step = 1; step <= 3; ++step) {
    h = at::relu(at::matmul(h, w.t()) + c + (7.0 + step));
    const Op& relu = Get(result->trace, absl::StrCat("relu_1_4:", step));
    EXPECT_TRUE(at::allclose(relu.out, h, 1e-5, 1e-6)) << step;
  }
  EXPECT_TRUE(at::allclose(Get(result->trace, "output_1").out, h, 1e-5, 1e-6));
  // Capture truth, the edit tensor and the original trace are untouched.
  ExpectUnchanged(SavedTensors(trace), before);
  EXPECT_TRUE(at::equal(seven, seven_copy));
  for (int v = 1; v <= 4; ++v) EXPECT_TRUE(at::equal(*b.value_at(v), at::full({4}, v - 1.0)));
  // The fork is a true trace of the edited computation.
  absl::StatusOr<ValidationReport> report = ValidateForwardPass(result->trace);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->passed) << absl::StrJoin(report->failures, "\n");
}

// NOTE [Forks that keep only their results]: the same edit, keeping only outputs and buffer
// versions, gives the same results (b = 7, 8, 9, 10; the output by hand) and drops the
// re-executed activations.
TEST(DoTest, ForkKeepingOnlyResults) {
  torch::jit::Module model = testdata::LoadModel("counter_cell");
  const Trace trace = Capture("counter_cell");
  const std::vector<at::Tensor> before = Clones(SavedTensors(trace));
  DoOptions options;
  options.keep_values = false;
  absl::StatusOr<DoResult> result = Do(trace, {Edit{"b:1", at::full({4}, 7.0)}}, options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_THAT(result->warnings, IsEmpty());
  const Buffer& forked = result->trace.buffers().at("b");
  for (int v = 1; v <= 4; ++v) {
    EXPECT_TRUE(at::equal(*forked.value_at(v), at::full({4}, 6.0 + v))) << v;
  }
  const at::Tensor w = model.attr("cell").toModule().attr("weight").toTensor().detach();
  const at::Tensor c = model.attr("cell").toModule().attr("bias").toTensor().detach();
  at::Tensor h = testdata::Expected("counter_cell").input(0);
  for (int step = 1; step <= 3; ++step) h = at::relu(at::matmul(h, w.t()) + c + (7.0 + step));
  EXPECT_TRUE(at::allclose(Get(result->trace, "output_1").out, h, 1e-5, 1e-6));
  for (int step = 1; step <= 3; ++step) {
    EXPECT_FALSE(Get(result->trace, absl::StrCat("relu_1_4:", step)).out.defined()) << step;
    // The original keeps its values.
    EXPECT_TRUE(Get(trace, absl::StrCat("relu_1_4:", step)).out.defined()) << step;
  }
  EXPECT_FALSE(result->trace.has_saved_values());
  absl::StatusOr<ValidationReport> report = ValidateForwardPass(result->trace);
  EXPECT_EQ(report.status().code(), absl::StatusCode::kFailedPrecondition);
  ExpectUnchanged(SavedTensors(trace), before);
}

TEST(DoTest, InplaceActivation) {
  const Trace trace = Capture("inplace_activation");
  const Op& relu = Get(trace, "relu_1_2:1");
  absl::StatusOr<DoResult> result = Do(trace, {Edit{relu.label, at::full_like(relu.out, 5.0)}});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(at::equal(Get(result->trace, "relu_1_2:1").out, at::full({1, 3}, 5.0)));
  EXPECT_TRUE(at::equal(Get(result->trace, "add__1_3:1").out, at::full({1, 3}, 6.0)));
  EXPECT_TRUE(at::equal(Get(result->trace, "mul_1_4:1").out, at::full({1, 3}, 12.0)));
  EXPECT_TRUE(at::equal(Get(result->trace, "output_1").out, at::full({1, 3}, 12.0)));
  EXPECT_THAT(result->reexecuted, ElementsAre("add__1_3:1", "mul_1_4:1"));
  EXPECT_FALSE(at::equal(Get(trace, "output_1").out, at::full({1, 3}, 12.0)));
}

TEST(DoTest, ConeReExecutesOnlyDownstreamNodes) {
  const Trace trace = Capture("mlp");
  const Op& last = Get(trace, "linear_2_3:1");
  absl::StatusOr<DoResult> last_edit = Do(trace, {Edit{last.label, at::zeros_like(last.out)}});
  ASSERT_TRUE(last_edit.ok()) << last_edit.status();
  EXPECT_THAT(last_edit->reexecuted, IsEmpty());
  EXPECT_TRUE(at::equal(Get(last_edit->trace, "output_1").out, at::zeros_like(last.out)));

  const Op& relu = Get(trace, "relu_1_2:1");
  absl::StatusOr<DoResult> middle = Do(trace, {Edit{relu.label, at::ones_like(relu.out)}});
  ASSERT_TRUE(middle.ok()) << middle.status();
  EXPECT_THAT(middle->reexecuted, ElementsAre("linear_2_3:1"));
  // Outside the cone the fork shares the original's tensors.
  EXPECT_EQ(Get(middle->trace, "linear_1_1:1").out.unsafeGetTensorImpl(),
            Get(trace, "linear_1_1:1").out.unsafeGetTensorImpl());

  const Op& input = Get(trace, "input_1");
  absl::StatusOr<DoResult> first = Do(trace, {Edit{"input_1", input.out * 2}});
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_THAT(first->reexecuted, ElementsAre("linear_1_1:1", "relu_1_2:1", "linear_2_3:1"));
  torch::jit::Module model = testdata::LoadModel("mlp");
  const at::Tensor expected = model.forward({input.out * 2}).toTensor();
  EXPECT_TRUE(at::allclose(Get(first->trace, "output_1").out, expected, 1e-6, 1e-6));
}

TEST(DoTest, SeveralEditsAndAForkOfAFork) {
  const Trace trace = Capture("mlp");
  const Op& fc1 = Get(trace, "linear_1_1:1");
  const Op& relu = Get(trace, "relu_1_2:1");
  absl::StatusOr<DoResult> both = Do(trace, {Edit{fc1.label, at::full_like(fc1.out, -1.0)},
                                             Edit{relu.label, at::full_like(relu.out, 2.0)}});
  ASSERT_TRUE(both.ok()) << both.status();
  // The relu edit wins over the relu the fc1 edit would have recomputed.
  EXPECT_TRUE(at::equal(Get(both->trace, "relu_1_2:1").out, at::full_like(relu.out, 2.0)));
  EXPECT_THAT(both->reexecuted, ElementsAre("linear_2_3:1"));

  absl::StatusOr<DoResult> fork_of_fork =
      Do(both->trace, {Edit{"relu_1_2:1", at::full_like(relu.out, 3.0)}});
  ASSERT_TRUE(fork_of_fork.ok()) << fork_of_fork.status();
  absl::StatusOr<DoResult> direct = Do(trace, {Edit{"relu_1_2:1", at::full_like(relu.out, 3.0)}});
  ASSERT_TRUE(direct.ok());
  EXPECT_TRUE(
      at::equal(Get(fork_of_fork->trace, "output_1").out, Get(direct->trace, "output_1").out));
  EXPECT_TRUE(at::equal(Get(both->trace, "relu_1_2:1").out, at::full_like(relu.out, 2.0)));
}

TEST(DoTest, SliceWriteThreadsThroughItsAliasWrite) {
  // self.b[:2].copy_(x): the write is redone on the previous version (NOTE [Writes
  // through aliases]), so the new b is [5x, 5x, 0, 0] by hand.
  const Trace trace = Capture("slice_copy");
  const Op& input = Get(trace, "input_1");
  absl::StatusOr<DoResult> result =
      Do(trace, {Edit{"input_1", input.out * 5}}, DoOptions{/*strict=*/true});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_THAT(result->warnings, IsEmpty());
  EXPECT_TRUE(at::equal(result->trace.buffers().at("b").final_value,
                        at::cat({input.out * 5, at::zeros({2})})));
  EXPECT_TRUE(at::equal(Get(result->trace, "output_1").out, input.out * 10));
  EXPECT_TRUE(at::equal(trace.buffers().at("b").final_value, at::cat({input.out, at::zeros({2})})));
}

TEST(DoTest, TrainingBatchNormRunningStatsThreadWhenTheyCertify) {
  const Trace trace = Capture("bn2d_train");
  const Op& input = Get(trace, "input_1");
  absl::StatusOr<DoResult> result =
      Do(trace, {Edit{"input_1", input.out + 1}}, DoOptions{/*strict=*/true});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_THAT(result->warnings, IsEmpty());
  // running_mean = 0.9 * initial + 0.1 * batch mean (hand arithmetic; the input moved by 1).
  const at::Tensor initial = trace.buffers().at("bn.running_mean").initial_value;
  const at::Tensor expected = initial * 0.9 + (input.out + 1).mean({0, 2, 3}) * 0.1;
  EXPECT_TRUE(at::allclose(result->trace.buffers().at("bn.running_mean").final_value, expected,
                           1e-6, 1e-6));
  EXPECT_FALSE(at::allclose(trace.buffers().at("bn.running_mean").final_value, expected));
}

TEST(DoTest, EvalBatchNormHasNoGap) {
  const Trace trace = Capture("bn2d_eval");
  const Op& input = Get(trace, "input_1");
  absl::StatusOr<DoResult> result = Do(trace, {Edit{"input_1", input.out + 1}}, DoOptions{true});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_THAT(result->warnings, IsEmpty());
}

TEST(DoTest, BadEditsChangeNothing) {
  const Trace trace = Capture("mlp");
  const Op& relu = Get(trace, "relu_1_2:1");
  absl::StatusOr<DoResult> unknown = Do(trace, {Edit{"relu_9_9:1", relu.out}});
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("relu_1_2:1"));
  EXPECT_EQ(Do(trace, {Edit{"relu:x", relu.out}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<DoResult> shape = Do(trace, {Edit{relu.label, at::zeros({3})}});
  EXPECT_EQ(shape.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(shape.status().message()), HasSubstr("shape [2, 8]"));
  absl::StatusOr<DoResult> dtype = Do(trace, {Edit{relu.label, relu.out.to(at::kDouble)}});
  EXPECT_EQ(dtype.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(dtype.status().message()), HasSubstr("Double"));
  EXPECT_EQ(Do(trace, {Edit{relu.label, relu.out}, Edit{"relu_1_2", relu.out}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Do(trace, {Edit{relu.label, at::Tensor()}}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace torchlens
