// Validation and interventions on traces built by hand (graph/trace_builder.h): each rule
// checked on the smallest trace that exercises it, with values from ATen itself.
#include <ATen/ATen.h>

#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "graph/trace_builder.h"
#include "gtest/gtest.h"
#include "validation/intervene.h"
#include "validation/validate.h"

namespace torchlens {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::StartsWith;
using Ref = TraceBuilder::Ref;

ValidationReport Validate(const Trace& trace) {
  absl::StatusOr<ValidationReport> report = ValidateForwardPass(trace);
  EXPECT_TRUE(report.ok()) << report.status();
  return report.ok() ? *report : ValidationReport();
}

// x * 3 -> output.
Trace Scaled(const at::Tensor& saved_product) {
  TraceBuilder b;
  const at::Tensor x = at::tensor({1.0f, -2.0f});
  const Ref input = b.AddInput(x);
  const Ref mul = b.AddOp("aten::mul", "Tensor", {input, TraceBuilder::Value(at::tensor(3.0f))},
                          {saved_product});
  b.AddOutput(mul);
  return b.Build();
}

TEST(HandTraceTest, ReplayReproducesTheSavedOutputBitForBit) {
  const ValidationReport good = Validate(Scaled(at::tensor({3.0f, -6.0f})));
  EXPECT_TRUE(good.passed) << absl::StrJoin(good.failures, "\n");
  EXPECT_EQ(good.perturbations_checked, 1);
  const ValidationReport bad = Validate(Scaled(at::tensor({3.0f, -6.5f})));
  EXPECT_THAT(bad.failures, Contains(StartsWith("mul_1_1:1: value mismatch on output 0 (max abs "
                                                "difference 0.5)")));
  // -0.0 and 0.0 are different bits (NOTE [Bitwise equality]).
  TraceBuilder b;
  const Ref input = b.AddInput(at::tensor({0.0f}));
  const Ref neg = b.AddOp("aten::neg", "", {input}, {at::tensor({0.0f})});
  b.AddOutput(neg);
  EXPECT_THAT(Validate(b.Build()).failures, ElementsAre(HasSubstr("equal values, different bits")));
}

// x = zeros(2, 2); x[0].fill_(1); return x
Trace FillThroughRow(const at::Tensor& written_base) {
  TraceBuilder b;
  const at::Tensor x = at::zeros({2, 2});
  const Ref input = b.AddInput(x);
  const Ref row = b.AddOp("aten::select", "int",
                          {input, TraceBuilder::Value(0), TraceBuilder::Value(0)}, {x[0]});
  AliasWrite write;
  write.before = ArgSource{ArgSource::Kind::kNode, "input_1", 0};
  write.written_tensor = 0;
  write.aliased = TensorGeometry{{2, 2}, {2, 1}, 0};
  write.written = TensorGeometry{{2}, {1}, 0};
  write.value = written_base;
  const Ref fill =
      b.AddOp("aten::fill_", "Scalar", {row, TraceBuilder::Value(1.0)}, {at::ones({2})}, {write});
  b.AddOutput(Ref{fill.node, -1, {}});
  return b.Build();
}

TEST(HandTraceTest, AliasWriteIsRedoneOnTheEarlierValue) {
  const at::Tensor after = at::tensor({1.0f, 1.0f, 0.0f, 0.0f}).reshape({2, 2});
  const ValidationReport good = Validate(FillThroughRow(after));
  EXPECT_TRUE(good.passed) << absl::StrJoin(good.failures, "\n");
  EXPECT_THAT(good.state_transition_only, IsEmpty());
  const ValidationReport bad = Validate(FillThroughRow(after.t().contiguous()));
  EXPECT_THAT(bad.failures, Contains(HasSubstr("written through an alias by fill__1_2:1")));
}

TEST(HandTraceTest, InterventionRedoesTheAliasWrite) {
  const Trace trace = FillThroughRow(at::tensor({1.0f, 1.0f, 0.0f, 0.0f}).reshape({2, 2}));
  absl::StatusOr<DoResult> result =
      Do(trace, {Edit{"input_1", at::full({2, 2}, 7.0f)}}, DoOptions{/*strict=*/true});
  ASSERT_TRUE(result.ok()) << result.status();
  // The row is filled with 1 again; the other row keeps the edited 7.
  EXPECT_TRUE(at::equal((*result->trace.Find("output_1"))->out,
                        at::tensor({1.0f, 1.0f, 7.0f, 7.0f}).reshape({2, 2})));
  EXPECT_THAT(result->reexecuted, ElementsAre("select_1_1:1", "fill__1_2:1"));
}

TEST(HandTraceTest, BufferVersionsMustBeTheirProducersValues) {
  auto build = [](const at::Tensor& version_value) {
    TraceBuilder b;
    const at::Tensor x = at::tensor({1.0f, 2.0f});
    const Ref input = b.AddInput(x);
    const Ref read = b.AddBufferRead("b", at::zeros({2}));
    const Ref add = b.AddOp("aten::add_", "Tensor", {read, input, TraceBuilder::Value(1)}, {x});
    b.AddBufferWrite("b", WriteKind::kInplace, add, version_value);
    b.AddOutput(input);
    return b.Build();
  };
  EXPECT_TRUE(Validate(build(at::tensor({1.0f, 2.0f}))).passed);
  EXPECT_THAT(Validate(build(at::tensor({1.0f, 3.0f}))).failures,
              ElementsAre(StartsWith("buffer_1:2: the written value of b is not the output of "
                                     "add__1_1:1")));
}

TEST(HandTraceTest, EdgeNoPerturbationCanProveIsUnprovedWithItsReason) {
  // x ^ x computes without using x's values: unproved, for that reason. (x & 0 is exempt:
  // the zeros absorb x, NOTE [Data-dependent exemptions].)
  TraceBuilder computes;
  const at::Tensor ints = at::tensor({5, -3}, at::kLong);
  const Ref input = computes.AddInput(ints);
  const Ref cancelled =
      computes.AddOp("aten::bitwise_xor", "Tensor", {input, input}, {at::zeros({2}, at::kLong)});
  computes.AddOutput(cancelled);
  const ValidationReport ignores = Validate(computes.Build());
  EXPECT_TRUE(ignores.passed) << absl::StrJoin(ignores.failures, "\n");
  EXPECT_THAT(ignores.unproved,
              ElementsAre(HasSubstr("bitwise_xor_1_1:1 <- input_1: no perturbation tried changes "
                                    "the output (for these values the op does not depend")));
  // x | true decides true whatever x: unproved, as a predicate.
  TraceBuilder decides;
  const at::Tensor flags = at::tensor({1, 0}, at::kInt).to(at::kBool);
  const Ref flag_input = decides.AddInput(flags);
  const Ref any = decides.AddOp("aten::logical_or", "",
                                {flag_input, TraceBuilder::Value(at::ones({2}, at::kBool))},
                                {at::ones({2}, at::kBool)});
  decides.AddOutput(any);
  const ValidationReport report = Validate(decides.Build());
  EXPECT_TRUE(report.passed) << absl::StrJoin(report.failures, "\n");
  EXPECT_THAT(report.unproved, ElementsAre(HasSubstr("logical_or_1_1:1 <- input_1")));
}

// x * zeros, both complex: no value of x changes the product, and the saved zeros prove it
// (ZeroedByAnotherArgument), for complex values as for real ones.
TEST(HandTraceTest, ComplexProductWithAZeroFactor) {
  TraceBuilder b;
  const at::Tensor x = at::tensor({1.0, -2.0}).to(at::kComplexFloat) * c10::complex<double>(1, 1);
  const at::Tensor zeros = at::zeros({2}, at::kComplexFloat);
  const Ref input = b.AddInput(x);
  const Ref zero_input = b.AddInput(zeros);
  const Ref product = b.AddOp("aten::mul", "Tensor", {input, zero_input}, {x * zeros});
  b.AddOutput(product);
  const ValidationReport report = Validate(b.Build());
  EXPECT_TRUE(report.passed) << absl::StrJoin(report.failures, "\n");
  EXPECT_THAT(report.unproved, IsEmpty());
}

}  // namespace
}  // namespace torchlens
