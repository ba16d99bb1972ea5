// NOTE [Perturbing a corner]: the corner's geometry by hand arithmetic, the corner pair's
// results against eager LibTorch on the whole input, and the verdicts of edges the corner
// cannot prove.
#include "validation/corner_replay.h"

#include <torch/torch.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "torchlens_dispatch/capture.h"
#include "validation/replay.h"
#include "validation/validate.h"

namespace torchlens {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::IsEmpty;

using Forward = std::function<torch::Tensor(const torch::Tensor&)>;

// A trace of `forward` on `x`.
Trace CaptureOf(torch::nn::Module& module, const Forward& forward, const torch::Tensor& x) {
  torch::NoGradGuard no_grad;
  CaptureGuard guard(module);
  torch::Tensor out = forward(x);
  absl::StatusOr<Trace> trace = guard.Finish(out);
  EXPECT_TRUE(trace.ok()) << trace.status();
  return trace.ok() ? *std::move(trace) : Trace();
}

// The only op of `trace` named `func_name`.
const Op* OnlyOp(const Trace& trace, const std::string& func_name) {
  const Op* found = nullptr;
  for (const Op& op : trace.ops()) {
    if (op.func_name != func_name) continue;
    EXPECT_EQ(found, nullptr) << "two " << func_name;
    found = &op;
  }
  EXPECT_NE(found, nullptr) << "no " << func_name;
  return found;
}

// The first output position (index 0 along every spatial dimension) of sample 0 of `out`.
torch::Tensor FirstPosition(const torch::Tensor& out, int spatial) {
  torch::Tensor first = out[0];
  for (int i = 0; i < spatial; ++i) first = first.select(-1, 0);
  return first;
}

struct WindowedCase {
  std::string name;
  std::function<std::shared_ptr<torch::nn::Module>()> make;
  std::vector<int64_t> input_shape;
  std::string func_name;
  std::vector<int64_t> extent;  // by hand: dilation * (kernel - 1) - padding + 1
};

std::vector<WindowedCase> WindowedCases() {
  namespace nn = torch::nn;
  return {
      {"conv2d k3 p1",
       [] { return nn::Conv2d(nn::Conv2dOptions(4, 6, 3).padding(1)).ptr(); },
       {3, 4, 12, 12},
       "aten::conv2d",
       {2, 2}},
      {"conv2d k3 s2 p1 d2",
       [] { return nn::Conv2d(nn::Conv2dOptions(4, 6, 3).stride(2).padding(1).dilation(2)).ptr(); },
       {2, 4, 16, 16},
       "aten::conv2d",
       {4, 4}},
      {"conv2d k7 s2 p3",
       [] { return nn::Conv2d(nn::Conv2dOptions(3, 5, 7).stride(2).padding(3)).ptr(); },
       {1, 3, 20, 20},
       "aten::conv2d",
       {4, 4}},
      {"conv2d k(3,5) p(0,2) groups 2",
       [] {
         return nn::Conv2d(nn::Conv2dOptions(4, 6, {3, 5}).padding({0, 2}).groups(2)).ptr();
       },
       {2, 4, 10, 14},
       "aten::conv2d",
       {3, 3}},
      {"conv1d k5 p2",
       [] { return nn::Conv1d(nn::Conv1dOptions(4, 6, 5).padding(2)).ptr(); },
       {2, 4, 30},
       "aten::conv1d",
       {3}},
      {"conv3d k3 p1",
       [] { return nn::Conv3d(nn::Conv3dOptions(2, 3, 3).padding(1)).ptr(); },
       {1, 2, 8, 8, 8},
       "aten::conv3d",
       {2, 2, 2}},
      {"max_pool2d k3 s2 p1",
       [] { return nn::MaxPool2d(nn::MaxPool2dOptions(3).stride(2).padding(1)).ptr(); },
       {2, 4, 12, 12},
       "aten::max_pool2d",
       {2, 2}},
      {"max_pool2d k3 s2 ceil",
       [] { return nn::MaxPool2d(nn::MaxPool2dOptions(3).stride(2).ceil_mode(true)).ptr(); },
       {2, 4, 12, 13},
       "aten::max_pool2d",
       {3, 3}},
      {"max_pool2d k2 d2",
       [] { return nn::MaxPool2d(nn::MaxPool2dOptions(2).stride(2).dilation(2)).ptr(); },
       {1, 3, 12, 12},
       "aten::max_pool2d",
       {3, 3}},
      {"max_pool1d k4",
       [] { return nn::MaxPool1d(nn::MaxPool1dOptions(4)).ptr(); },
       {2, 3, 40},
       "aten::max_pool1d",
       {4}},
  };
}

// Calls a module built by WindowedCase::make (the C++ frontend has no common forward).
torch::Tensor ForwardOf(torch::nn::Module& module, const torch::Tensor& x) {
  if (auto* m = module.as<torch::nn::Conv1d>()) return m->forward(x);
  if (auto* m = module.as<torch::nn::Conv2d>()) return m->forward(x);
  if (auto* m = module.as<torch::nn::Conv3d>()) return m->forward(x);
  if (auto* m = module.as<torch::nn::MaxPool1d>()) return m->forward(x);
  if (auto* m = module.as<torch::nn::MaxPool2d>()) return m->forward(x);
  ADD_FAILURE() << "no forward for " << module.name();
  return x;
}

TEST(CornerReplayTest, CornerPairGivesTheWholeOpsFirstPositionForBothSamples) {
  for (const WindowedCase& c : WindowedCases()) {
    SCOPED_TRACE(c.name);
    torch::manual_seed(3);
    std::shared_ptr<torch::nn::Module> module = c.make();
    const torch::Tensor x = torch::randn(c.input_shape);
    const Trace trace = CaptureOf(
        *module, [&](const torch::Tensor& in) { return ForwardOf(*module, in); }, x);
    const Op* op = OnlyOp(trace, c.func_name);
    ASSERT_NE(op, nullptr);
    const std::optional<Corner> corner = FindCorner(*op);
    ASSERT_TRUE(corner.has_value());
    EXPECT_EQ(corner->input, 0);
    EXPECT_THAT(corner->extent, ElementsAreArray(c.extent));

    // The perturbed sample: the corner times -2 plus 1, which changes every element.
    const auto perturb = [](const torch::Tensor& t) -> std::optional<at::Tensor> {
      return t * -2 + 1;
    };
    std::optional<std::vector<c10::IValue>> pair =
        CornerPairArguments(*op, *corner, {corner->input}, perturb);
    ASSERT_TRUE(pair.has_value());
    absl::StatusOr<ReplayResult> run = ReplayOp(*op, *std::move(pair));
    ASSERT_TRUE(run.ok()) << run.status();
    ASSERT_EQ(run->outputs.size(), 1u);
    const torch::Tensor& out = run->outputs[0];
    ASSERT_EQ(out.size(0), 2);
    EXPECT_TRUE(PairSamplesDiffer(*corner, run->outputs));

    // Oracle: eager LibTorch on the whole first sample, as saved and with its corner
    // perturbed as the pair's second sample is.
    const int spatial = static_cast<int>(c.extent.size());
    torch::NoGradGuard no_grad;
    torch::Tensor first = x.narrow(0, 0, 1).clone();
    const torch::Tensor expected = FirstPosition(ForwardOf(*module, first), spatial);
    torch::Tensor region = first;
    for (int i = 0; i < spatial; ++i) region = region.narrow(2 + i, 0, c.extent[i]);
    region.copy_(region * -2 + 1);
    const torch::Tensor expected_perturbed = FirstPosition(ForwardOf(*module, first), spatial);
    EXPECT_TRUE(torch::allclose(FirstPosition(out.narrow(0, 0, 1), spatial), expected, 1e-5, 1e-6));
    EXPECT_TRUE(torch::allclose(FirstPosition(out.narrow(0, 1, 1), spatial), expected_perturbed,
                                1e-5, 1e-6));
    EXPECT_FALSE(torch::equal(expected, expected_perturbed));

    // The whole trace validates, every edge proved.
    absl::StatusOr<ValidationReport> report = ValidateForwardPass(trace);
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_TRUE(report->passed) << absl::StrJoin(report->failures, "\n");
    EXPECT_THAT(report->unproved, IsEmpty());
    EXPECT_EQ(report->perturbations_checked, 1);
  }
}

TEST(CornerReplayTest, NoCornerWhereItCannotBeSmallOrTheWindowIsNotANumber) {
  namespace nn = torch::nn;
  torch::manual_seed(3);
  struct NoCorner {
    std::string name;
    std::function<std::shared_ptr<torch::nn::Module>()> make;
    std::vector<int64_t> input_shape;
    std::function<torch::Tensor(torch::nn::Module&, const torch::Tensor&)> forward;
    std::string func_name;
  };
  const auto conv2d = [](torch::nn::Module& m, const torch::Tensor& x) {
    return m.as<nn::Conv2d>()->forward(x);
  };
  const std::vector<NoCorner> cases = {
      // Window at position 0 over padding only: 1 * (1 - 1) - 1 + 1 = 0 elements.
      {"k1 p1",
       [] { return nn::Conv2d(nn::Conv2dOptions(2, 2, 1).padding(1)).ptr(); },
       {1, 2, 16, 16},
       conv2d,
       "aten::conv2d"},
      // Two corners of 2 x 2 are more than a quarter of a 3 x 3 input.
      {"small input",
       [] { return nn::Conv2d(nn::Conv2dOptions(2, 2, 3).padding(1)).ptr(); },
       {1, 2, 3, 3},
       conv2d,
       "aten::conv2d"},
      // An unbatched input has no sample to pair.
      {"unbatched",
       [] { return nn::Conv2d(nn::Conv2dOptions(2, 2, 3).padding(1)).ptr(); },
       {2, 16, 16},
       conv2d,
       "aten::conv2d"},
      {"padding same",
       [] { return nn::Conv2d(nn::Conv2dOptions(2, 2, 3).padding(torch::kSame)).ptr(); },
       {1, 2, 16, 16},
       conv2d,
       "aten::conv2d"},
      {"transposed",
       [] { return nn::ConvTranspose2d(nn::ConvTranspose2dOptions(2, 2, 3)).ptr(); },
       {1, 2, 16, 16},
       [](torch::nn::Module& m, const torch::Tensor& x) {
         return m.as<nn::ConvTranspose2d>()->forward(x);
       },
       "aten::conv_transpose2d"},
  };
  for (const NoCorner& c : cases) {
    SCOPED_TRACE(c.name);
    std::shared_ptr<torch::nn::Module> module = c.make();
    const Trace trace = CaptureOf(
        *module, [&](const torch::Tensor& in) { return c.forward(*module, in); },
        torch::randn(c.input_shape));
    const Op* op = OnlyOp(trace, c.func_name);
    ASSERT_NE(op, nullptr);
    EXPECT_FALSE(FindCorner(*op).has_value());
  }
}

// A convolution whose only non-zero weights are taps the first window puts on padding:
// the corner cannot see the input, so the edge is proved by perturbing the whole input, as
// before corners; with no non-zero weight at all it is exempt (a product's other factor
// all zeros, ZeroedByAnotherArgument), neither proved nor failed, as before corners.
TEST(CornerReplayTest, EdgesTheCornerCannotProveArePerturbedWhole) {
  namespace nn = torch::nn;
  torch::NoGradGuard no_grad;
  nn::Conv2d conv(nn::Conv2dOptions(3, 4, 3).padding(1));
  conv->weight.zero_();
  conv->weight.select(3, 0).select(2, 0).fill_(1.0);  // tap (0, 0): padding at position 0
  torch::manual_seed(5);
  const torch::Tensor x = torch::randn({1, 3, 16, 16});
  const auto forward = [&](const torch::Tensor& in) { return conv->forward(in); };
  Trace trace = CaptureOf(*conv, forward, x);
  const Op* op = OnlyOp(trace, "aten::conv2d");
  ASSERT_NE(op, nullptr);
  const std::optional<Corner> corner = FindCorner(*op);
  ASSERT_TRUE(corner.has_value());
  std::optional<std::vector<c10::IValue>> pair = CornerPairArguments(
      *op, *corner, {corner->input},
      [](const torch::Tensor& t) -> std::optional<at::Tensor> { return -1 - t; });
  ASSERT_TRUE(pair.has_value());
  absl::StatusOr<ReplayResult> run = ReplayOp(*op, *std::move(pair));
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_FALSE(PairSamplesDiffer(*corner, run->outputs));  // the corner proves nothing here
  absl::StatusOr<ValidationReport> report = ValidateForwardPass(trace);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->passed) << absl::StrJoin(report->failures, "\n");
  EXPECT_THAT(report->unproved, IsEmpty());
  EXPECT_EQ(report->perturbations_checked, 1);

  conv->weight.zero_();
  trace = CaptureOf(*conv, forward, x);
  report = ValidateForwardPass(trace);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->passed) << absl::StrJoin(report->failures, "\n");
  EXPECT_EQ(report->perturbations_checked, 0);
  EXPECT_THAT(report->unproved, IsEmpty());  // exempt: ZeroedByAnotherArgument
}

}  // namespace
}  // namespace torchlens
