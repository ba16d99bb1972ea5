// Source positions and branches (graph/trace.h SourcePosition), checked against the lines
// Python's `inspect` found in tools/gen_testdata.py (testdata "branchy": an if/else on the
// input's sum around a Linear).
#include "torchlens_dispatch/source_positions.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "graph/json_export.h"
#include "graph/render.h"
#include "graph/summary.h"
#include "testdata/testdata.h"
#include "torchlens_dispatch/capture.h"
#include "torchlens_dispatch/script_runner.h"

namespace torchlens {
namespace {

using ::testing::HasSubstr;

// The only compute op of `type`.
const Op& OnlyOp(const Trace& trace, const std::string& type) {
  const Op* found = nullptr;
  for (const Op& op : trace.ops()) {
    if (op.is_compute() && op.type == type) {
      EXPECT_EQ(found, nullptr) << "two " << type << " ops";
      found = &op;
    }
  }
  if (found == nullptr) {
    ADD_FAILURE() << "no " << type << " op";
    static const Op* const kNone = new Op();
    return *kNone;
  }
  return *found;
}

class SourcePositionsTest : public ::testing::Test {
 protected:
  SourcePositionsTest() : model_(testdata::LoadModel("branchy")), expected_("branchy") {
    model_.eval();
  }

  Trace Capture(const at::Tensor& x) {
    absl::StatusOr<Trace> trace = TraceModule(model_, {x});
    EXPECT_TRUE(trace.ok()) << trace.status();
    return trace.ok() ? *std::move(trace) : Trace();
  }

  // Whether `op` is at the statement `key` of source_markers() in tools/gen_testdata.py.
  void ExpectAt(const Op& op, const std::string& key, const std::string& file_suffix) {
    ASSERT_NE(op.source_position, nullptr) << op.label;
    EXPECT_TRUE(absl::EndsWith(op.source_position->file, file_suffix))
        << op.label << ": " << op.source_position->file;
    EXPECT_EQ(op.source_position->line, expected_.source_line(key)) << op.label;
    EXPECT_EQ(op.source_position->text, expected_.source_text(key)) << op.label;
  }

  void ExpectInBranch(const Op& op, bool then) {
    ASSERT_NE(op.source_position, nullptr) << op.label;
    ASSERT_EQ(op.source_position->branches.size(), 1u) << op.label;
    const BranchTaken& branch = op.source_position->branches[0];
    EXPECT_TRUE(absl::EndsWith(branch.file, "gen_testdata.py")) << branch.file;
    EXPECT_EQ(branch.line, expected_.source_line("if"));
    EXPECT_EQ(branch.text, expected_.source_text("if"));
    EXPECT_EQ(branch.then, then) << op.label;
  }

  torch::jit::Module model_;
  testdata::Expected expected_;
};

TEST_F(SourcePositionsTest, ThenBranchOpsNameTheirLinesAndTheBranch) {
  const Trace trace = Capture(expected_.input(0));  // all ones: the sum is positive
  const Op& mul = OnlyOp(trace, "mul");
  ExpectAt(mul, "mul", "gen_testdata.py");
  EXPECT_TRUE(mul.source_position->branches.empty());
  ExpectAt(OnlyOp(trace, "gt"), "if", "gen_testdata.py");
  const Op& relu = OnlyOp(trace, "relu");
  ExpectAt(relu, "relu", "gen_testdata.py");
  ExpectInBranch(relu, /*then=*/true);
  // The Linear's op is in torch/nn/modules/linear.py, inside the branch that called it.
  const Op& linear = OnlyOp(trace, "linear");
  ExpectAt(linear, "linear", "torch/nn/modules/linear.py");
  ExpectInBranch(linear, /*then=*/true);
  const Op& add = OnlyOp(trace, "add");
  ExpectAt(add, "add", "gen_testdata.py");
  EXPECT_TRUE(add.source_position->branches.empty());
  // Buffer versions, inputs and outputs have none.
  EXPECT_EQ(trace.ops().front().source_position, nullptr);
  EXPECT_EQ(trace.ops().back().source_position, nullptr);
}

TEST_F(SourcePositionsTest, ElseBranchRunsAnotherStatement) {
  const Trace trace = Capture(-expected_.input(0));
  const Op& tanh = OnlyOp(trace, "tanh");
  ExpectAt(tanh, "tanh", "gen_testdata.py");
  ExpectInBranch(tanh, /*then=*/false);
  for (const Op& op : trace.ops()) EXPECT_NE(op.type, "linear") << "the then branch did not run";
}

TEST_F(SourcePositionsTest, OpsOfOneStatementShareOnePositionAcrossCaptures) {
  const Trace first = Capture(expected_.input(0));
  const Trace second = Capture(expected_.input(0) * 3);
  EXPECT_EQ(OnlyOp(first, "relu").source_position, OnlyOp(second, "relu").source_position);
}

// The plan owns its sites' positions, and a trace keeps that owner alive: a trace read
// after its model and the model's plan are gone still has them (AddressSanitizer in CI
// would see a read of freed memory).
TEST(SourcePositionsLifetimeTest, TracesKeepThemAfterTheModelAndItsPlanAreGone) {
  const testdata::Expected expected("branchy");
  Trace trace;
  {
    torch::jit::Module model = testdata::LoadModel("branchy");
    model.eval();
    absl::StatusOr<Trace> captured = TraceModule(model, {expected.input(0)});
    ASSERT_TRUE(captured.ok()) << captured.status();
    trace = *std::move(captured);
  }
  const size_t plans_before = PrivatePlansForTesting();
  // Dead models' plans are swept once the cache has doubled (NOTE [Private plan lifetime]).
  for (int i = 0; i < 40; ++i) {
    torch::jit::Module other = testdata::LoadModel("branchy");
    other.eval();
    ASSERT_TRUE(TraceModule(other, {expected.input(0)}).ok());
  }
  EXPECT_LT(PrivatePlansForTesting(), plans_before + 40) << "no plan was swept";
  const Op& relu = OnlyOp(trace, "relu");
  ASSERT_NE(relu.source_position, nullptr);
  EXPECT_EQ(relu.source_position->line, expected.source_line("relu"));
  EXPECT_EQ(relu.source_position->text, expected.source_text("relu"));
  ASSERT_EQ(relu.source_position->branches.size(), 1u);
  EXPECT_EQ(relu.source_position->branches[0].line, expected.source_line("if"));
}

TEST_F(SourcePositionsTest, SummaryRenderAndJsonShowThem) {
  const Trace trace = Capture(expected_.input(0));
  const std::string relu_at = absl::StrCat("gen_testdata.py:", expected_.source_line("relu"));
  const std::string branch = absl::StrCat("then of :", expected_.source_line("if"));
  EXPECT_THAT(FormatSummary(trace), HasSubstr(absl::StrCat(relu_at, " (", branch, ")")));

  const std::string dot = RenderDot(trace);
  EXPECT_THAT(
      dot, HasSubstr(absl::StrCat("then of if at gen_testdata.py:", expected_.source_line("if"))));
  EXPECT_THAT(dot, HasSubstr(absl::StrCat(relu_at, ": ", expected_.source_text("relu"))));

  absl::StatusOr<std::string> json = TraceToJson(trace);
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_THAT(*json, HasSubstr(absl::StrCat("\"line\": ", expected_.source_line("relu"))));
  EXPECT_THAT(*json, HasSubstr(absl::StrCat("\"text\": \"", expected_.source_text("relu"))));
  EXPECT_THAT(*json, HasSubstr("\"taken\": \"then\""));

  // Trace files keep them: graph/export_test.cc's round trip compares every op's position
  // (nested_branches among its models).
}

// A forward the caller runs under a CaptureGuard (no site markers): the interpreter locates
// each op, which gives its statement but not the branches it is in (NOTE [Source
// positions]).
TEST_F(SourcePositionsTest, InterpreterLocatedOpsHaveTheirStatementWithoutBranches) {
  CaptureGuard guard(model_);
  const c10::IValue y = model_.forward({expected_.input(0)});
  absl::StatusOr<Trace> trace = guard.Finish(y);
  ASSERT_TRUE(trace.ok()) << trace.status();
  const Op& relu = OnlyOp(*trace, "relu");
  ExpectAt(relu, "relu", "gen_testdata.py");
  EXPECT_TRUE(relu.source_position->branches.empty());
  ExpectAt(OnlyOp(*trace, "linear"), "linear", "torch/nn/modules/linear.py");
  ExpectAt(OnlyOp(*trace, "mul"), "mul", "gen_testdata.py");
}

// NestedBranches: `for i in range(2): if i == 0: x = x * 2.0 else: if bool(x.sum() > 0):
// x = _shift_if_large(x) ...`, where the helper has an `if` of its own. For an input of
// ones, the second iteration takes the else of the loop's if, the then of the sum's if and
// the then of the helper's if.
TEST(SourcePositionsNestedTest, BranchesNestAcrossLoopsElsesAndHelperFunctions) {
  torch::jit::Module model = testdata::LoadModel("nested_branches");
  testdata::Expected expected("nested_branches");
  absl::StatusOr<Trace> trace = TraceModule(model, {expected.input(0)});
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_TRUE(at::equal(trace->ops().back().out, expected.output(0)));
  // The branches of `op`, outermost first, as (statement key, then) pairs.
  auto expect_branches = [&](const Op& op,
                             const std::vector<std::pair<std::string, bool>>& branches) {
    ASSERT_NE(op.source_position, nullptr) << op.label;
    ASSERT_EQ(op.source_position->branches.size(), branches.size()) << op.label;
    for (size_t k = 0; k < branches.size(); ++k) {
      const BranchTaken& taken = op.source_position->branches[k];
      EXPECT_EQ(taken.line, expected.source_line(branches[k].first)) << op.label << " " << k;
      EXPECT_EQ(taken.text, expected.source_text(branches[k].first)) << op.label << " " << k;
      EXPECT_EQ(taken.then, branches[k].second) << op.label << " " << k;
    }
  };
  const Op& mul = OnlyOp(*trace, "mul");
  EXPECT_EQ(mul.source_position->line, expected.source_line("mul"));
  expect_branches(mul, {{"loop_if", true}});
  expect_branches(OnlyOp(*trace, "sum"), {{"loop_if", false}});
  const Op& sub = OnlyOp(*trace, "sub");
  EXPECT_EQ(sub.source_position->line, expected.source_line("sub"));
  EXPECT_EQ(sub.source_position->text, expected.source_text("sub"));
  expect_branches(sub, {{"loop_if", false}, {"sum_if", true}, {"helper_if", true}});
  expect_branches(OnlyOp(*trace, "mean"), {{"loop_if", false}, {"sum_if", true}});
}

// Ops outside TorchScript code (a torch::nn module written in C++) have no position.
TEST(SourcePositionsNnTest, CppModulesHaveNone) {
  torch::nn::Linear linear(3, 2);
  CaptureGuard guard(*linear);
  const at::Tensor y = linear->forward(torch::ones({1, 3}));
  absl::StatusOr<Trace> trace = guard.Finish(y);
  ASSERT_TRUE(trace.ok()) << trace.status();
  int compute = 0;
  for (const Op& op : trace->ops()) {
    compute += op.is_compute();
    EXPECT_EQ(op.source_position, nullptr) << op.label;
  }
  EXPECT_GT(compute, 0);
}

}  // namespace
}  // namespace torchlens
