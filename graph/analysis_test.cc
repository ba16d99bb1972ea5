// Answers over traces: comparing two runs, the first non-finite value, the structure
// hash. Captures of the test models; expected values from eager PyTorch or hand
// arithmetic.
#include <ATen/Parallel.h>
#include <torch/script.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "gmock/gmock.h"
#include "graph/compare.h"
#include "graph/non_finite.h"
#include "graph/op_timing.h"
#include "graph/structure_hash.h"
#include "graph/summary.h"
#include "graph/trace_builder.h"
#include "gtest/gtest.h"
#include "testdata/testdata.h"
#include "testdata/trace_testing.h"
#include "torchlens_dispatch/capture.h"

namespace torchlens {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Pair;
using ::torchlens::testing_util::Capture;
using ::torchlens::testing_util::Get;

Trace CaptureDemo(torch::jit::Module& model, const at::Tensor& x) {
  absl::StatusOr<Trace> trace = TraceModule(model, {x});
  EXPECT_TRUE(trace.ok()) << trace.status();
  return trace.ok() ? *std::move(trace) : Trace();
}

TEST(AnalysisTest, SameModelAtOneAndTwoThreadsDoesNotDiverge) {
  // Fresh models: the demo counts its calls in a buffer.
  torch::jit::Module model = testdata::LoadModel("demo");
  torch::jit::Module same = testdata::LoadModel("demo");
  const at::Tensor x = testdata::Expected("demo").input(0);
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const Trace one = CaptureDemo(model, x);
  at::set_num_threads(2);
  const Trace two = CaptureDemo(same, x);
  at::set_num_threads(threads);
  absl::StatusOr<Comparison> diff = Compare(one, two);
  ASSERT_TRUE(diff.ok()) << diff.status();
  EXPECT_FALSE(diff->first_divergence.has_value()) << FormatComparison(*diff);
  EXPECT_THAT(diff->only_in_a, IsEmpty());
  EXPECT_EQ(diff->nodes.size(), one.ops().size());
  for (const NodeComparison& node : diff->nodes) {
    EXPECT_TRUE(node.values_compared) << node.label;
    EXPECT_LT(node.max_abs_diff, 1e-5) << node.label;
  }
}

TEST(AnalysisTest, PerturbedWeightIsTheFirstDivergence) {
  torch::jit::Module model = testdata::LoadModel("demo");
  const at::Tensor x = testdata::Expected("demo").input(0);
  const Trace reference = CaptureDemo(model, x);
  torch::jit::Module perturbed = testdata::LoadModel("demo");
  for (const torch::jit::NameTensor& param : perturbed.named_parameters()) {
    if (param.name == "block2.conv.weight") {
      torch::NoGradGuard no_grad;
      param.value.mul_(1.01);
    }
  }
  const Trace changed = CaptureDemo(perturbed, x);
  absl::StatusOr<Comparison> diff = Compare(reference, changed);
  ASSERT_TRUE(diff.ok()) << diff.status();
  ASSERT_TRUE(diff->first_divergence.has_value());
  const Op& first = Get(reference, *diff->first_divergence);
  EXPECT_EQ(first.type, "conv2d");
  EXPECT_EQ(first.module_address, "block2.conv");
  EXPECT_THAT(FormatComparison(*diff), HasSubstr(first.label + " "));
  // Everything before it is bit-identical.
  for (const NodeComparison& node : diff->nodes) {
    if (node.label == first.label) break;
    EXPECT_EQ(node.max_abs_diff, 0.0) << node.label;
  }
}

TEST(AnalysisTest, FloatAgainstDoubleDiffersByRoundingOnly) {
  torch::jit::Module model = testdata::LoadModel("mlp");
  const at::Tensor x = testdata::Expected("mlp").input(0);
  const Trace single = CaptureDemo(model, x);
  torch::jit::Module doubled = testdata::LoadModel("mlp");
  doubled.to(at::kDouble);
  const Trace precise = CaptureDemo(doubled, x.to(at::kDouble));
  absl::StatusOr<Comparison> diff = Compare(single, precise, CompareOptions{1e-5, 1e-4});
  ASSERT_TRUE(diff.ok()) << diff.status();
  EXPECT_FALSE(diff->first_divergence.has_value()) << FormatComparison(*diff);
  const NodeComparison& last = diff->nodes[diff->nodes.size() - 2];  // fc2's linear
  EXPECT_THAT(last.differences, ElementsAre("dtype Float vs Double"));
  EXPECT_GT(last.max_abs_diff, 0.0);
  EXPECT_LT(last.max_abs_diff, 1e-5);
  absl::StatusOr<Comparison> strict = Compare(single, precise, CompareOptions{0.0, 0.0});
  ASSERT_TRUE(strict.ok());
  EXPECT_TRUE(strict->first_divergence.has_value());
  EXPECT_EQ(Compare(single, precise, CompareOptions{-1, 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(AnalysisTest, FirstNonFiniteIsTheDivisionByZero) {
  const Trace trace = Capture("divide_by_zero");
  absl::StatusOr<std::optional<NonFinite>> first = FirstNonFinite(trace);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(first->has_value());
  EXPECT_EQ((*first)->label, "div_1_4:1");  // linear, relu, sub, div
  EXPECT_EQ((*first)->module_address, "");
  EXPECT_TRUE((*first)->has_nan);  // 0 / 0 where relu cut
  // It made them from finite values.
  EXPECT_THAT((*first)->parents, ElementsAre(Pair("relu_1_2:1", true), Pair("sub_1_3:1", true)));
  // Eager PyTorch's output is non-finite too.
  const at::Tensor eager = testdata::Expected("divide_by_zero").output(0);
  EXPECT_FALSE(at::isfinite(eager).all().item<bool>());

  const absl::StatusOr<std::optional<NonFinite>> none = FirstNonFinite(Capture("mlp"));
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
}

TEST(AnalysisTest, StructureHashIgnoresValuesAndSeesStructure) {
  torch::jit::Module model = testdata::LoadModel("demo");
  const std::string hash = StructureHash(CaptureDemo(model, at::randn({1, 3, 16, 16})));
  EXPECT_EQ(hash.size(), 16u);
  EXPECT_EQ(StructureHash(CaptureDemo(model, at::randn({1, 3, 16, 16}))), hash);
  EXPECT_NE(StructureHash(CaptureDemo(model, at::randn({2, 3, 16, 16}))), hash);  // shapes
  // One edge moved: x * y against y * x.
  auto product = [](bool swapped) {
    TraceBuilder b;
    const TraceBuilder::Ref x = b.AddInput(at::ones({2}));
    const TraceBuilder::Ref y = b.AddInput(at::ones({2}));
    b.AddOutput(
        b.AddOp("aten::mul", "Tensor", {swapped ? y : x, swapped ? x : y}, {at::ones({2})}));
    return StructureHash(b.Build());
  };
  EXPECT_EQ(product(false), product(false));
  EXPECT_NE(product(false), product(true));
}

TEST(AnalysisTest, OpTimesNestInModuleCalls) {
  torch::jit::Module model = testdata::LoadModel("demo");
  const at::Tensor x = testdata::Expected("demo").input(0);
  CaptureOptions options;
  options.time_ops = true;
  absl::StatusOr<Trace> trace = TraceModule(model, {x}, options);
  ASSERT_TRUE(trace.ok()) << trace.status();
  int64_t sum = 0;
  int64_t previous_start = -1;
  int timed = 0;
  for (const Op& op : trace->ops()) {
    if (!op.is_compute()) {
      EXPECT_EQ(op.duration_ns, -1) << op.label;
      continue;
    }
    ++timed;
    EXPECT_GE(op.duration_ns, 0) << op.label;
    EXPECT_GE(op.start_ns, previous_start) << op.label;  // in execution order
    previous_start = op.start_ns;
    sum += op.duration_ns;
  }
  for (const Op& op : trace->ops()) {  // times from the first op
    if (!op.is_compute()) continue;
    EXPECT_EQ(op.start_ns, 0) << op.label;
    break;
  }
  const std::map<std::string, int64_t> totals = ModuleTotals(*trace);
  EXPECT_EQ(totals.at(""), sum);
  EXPECT_GE(totals.at("block1"), totals.at("block1.conv"));
  EXPECT_GT(totals.at("block1.conv"), 0);
  EXPECT_THAT(FormatSummary(*trace), HasSubstr("Time per module"));

  absl::StatusOr<std::string> chrome = ChromeTraceJson(*trace);
  ASSERT_TRUE(chrome.ok()) << chrome.status();
  const nlohmann::json events = nlohmann::json::parse(*chrome)["traceEvents"];
  int ops = 0;
  double block1_start = -1, block1_end = -1;
  for (const nlohmann::json& event : events) {
    EXPECT_EQ(event["ph"], "X");
    if (event["cat"] == "module" && event["name"] == "block1") {
      block1_start = event["ts"];
      block1_end = block1_start + event["dur"].get<double>();
    }
    if (event["cat"] != "module") ++ops;
  }
  EXPECT_EQ(ops, timed);
  ASSERT_GE(block1_start, 0);
  for (const nlohmann::json& event : events) {  // block1's ops lie inside its call
    if (event["cat"] == "module" ||
        event["args"]["module"].get<std::string>().rfind("block1", 0) != 0) {
      continue;
    }
    EXPECT_GE(event["ts"].get<double>(), block1_start);
    EXPECT_LE(event["ts"].get<double>() + event["dur"].get<double>(), block1_end + 1e-6);
  }
  // Untimed captures say so.
  EXPECT_EQ(ChromeTraceJson(Capture("mlp")).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*Capture("mlp").Find("linear_1_1:1"))->duration_ns, -1);
}

}  // namespace
}  // namespace torchlens
