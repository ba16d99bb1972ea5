// Module calls (graph/module_calls.h) on test models whose calls are known from their
// Python source (tools/gen_testdata.py), with values from eager PyTorch.
#include "graph/module_calls.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/script.h>

#include "absl/strings/str_cat.h"
#include "testdata/testdata.h"
#include "torchlens_dispatch/capture.h"

namespace torchlens {
namespace {

using ::testing::HasSubstr;

Trace Capture(const std::string& name, bool train = false) {
  torch::jit::Module model = testdata::LoadModel(name);
  model.train(train);
  absl::StatusOr<Trace> trace = TraceModule(model, testdata::Expected(name).inputs());
  EXPECT_TRUE(trace.ok()) << trace.status();
  return trace.ok() ? *std::move(trace) : Trace();
}

std::vector<std::string> Labels(const Trace& trace, const std::vector<int>& indices) {
  std::vector<std::string> labels;
  for (int index : indices) labels.push_back(trace.ops()[index].label);
  return labels;
}

// CallTwice: self.fc(torch.relu(self.fc(x))).
TEST(ModuleCallsTest, ASubmoduleCalledTwiceHasTwoCalls) {
  const Trace trace = Capture("call_twice");
  absl::StatusOr<std::vector<ModuleCall>> calls = ModuleCalls(trace, "fc");
  ASSERT_TRUE(calls.ok()) << calls.status();
  ASSERT_EQ(calls->size(), 2u);
  for (int k = 0; k < 2; ++k) {
    const ModuleCall& call = (*calls)[k];
    EXPECT_EQ(call.call, k + 1);
    ASSERT_EQ(call.ops.size(), 1u);
    EXPECT_EQ(call.outputs, call.ops);
    const Op& linear = trace.ops()[call.ops[0]];
    EXPECT_EQ(linear.type, "linear");
    EXPECT_EQ(linear.pass, k + 1);
  }
  // Values: the first call is fc(x), the second the model's output (eager PyTorch).
  absl::StatusOr<std::vector<std::vector<const Op*>>> outputs = FindModuleOutputs(trace, "fc");
  ASSERT_TRUE(outputs.ok()) << outputs.status();
  testdata::Expected expected("call_twice");
  torch::jit::Module model = testdata::LoadModel("call_twice");
  const at::Tensor weight = model.attr("fc").toModule().attr("weight").toTensor();
  const at::Tensor bias = model.attr("fc").toModule().attr("bias").toTensor();
  EXPECT_TRUE(at::allclose((*outputs)[0][0]->out, at::linear(expected.input(0), weight, bias)));
  EXPECT_TRUE(at::allclose((*outputs)[1][0]->out, expected.output(0)));
}

// LoopReuse: a TorchScript loop calls cell (tanh(fc(x))) three times in a row.
TEST(ModuleCallsTest, ConsecutiveCallsInALoopAreSplitWhereTheCodeStartsOver) {
  const Trace trace = Capture("loop_reuse");
  absl::StatusOr<std::vector<ModuleCall>> calls = ModuleCalls(trace, "cell");
  ASSERT_TRUE(calls.ok()) << calls.status();
  ASSERT_EQ(calls->size(), 3u);
  for (int k = 0; k < 3; ++k) {
    const ModuleCall& call = (*calls)[k];
    ASSERT_EQ(call.ops.size(), 2u);
    EXPECT_EQ(trace.ops()[call.ops[0]].type, "linear");
    EXPECT_EQ(trace.ops()[call.ops[1]].type, "tanh");
    EXPECT_EQ(trace.ops()[call.ops[1]].pass, k + 1);
    // The linear is read only inside the call; the tanh leaves it.
    EXPECT_EQ(Labels(trace, call.outputs), Labels(trace, {call.ops[1]}));
  }
  EXPECT_TRUE(at::allclose(trace.ops()[calls->back().outputs[0]].out,
                           testdata::Expected("loop_reuse").output(0)));
  absl::StatusOr<std::vector<ModuleCall>> inner = ModuleCalls(trace, "cell.fc");
  ASSERT_TRUE(inner.ok()) << inner.status();
  EXPECT_EQ(inner->size(), 3u);
}

// Demo: stem, block1, block2 (conv, bn, relu each), then the head; block1's BatchNorm
// writes its running statistics in training mode, which does not make it an output.
TEST(ModuleCallsTest, ABlockReturnsItsLastOp) {
  const Trace trace = Capture("demo", /*train=*/true);
  absl::StatusOr<std::vector<ModuleCall>> calls = ModuleCalls(trace, "block1");
  ASSERT_TRUE(calls.ok()) << calls.status();
  ASSERT_EQ(calls->size(), 1u);
  const ModuleCall& call = (*calls)[0];
  std::vector<std::string> types;
  for (int index : call.ops) types.push_back(trace.ops()[index].type);
  // Training-mode BatchNorm counts its batches first (num_batches_tracked.add_(1)); the
  // counter's new version is read by nothing, so only the relu leaves the call.
  EXPECT_EQ(types, (std::vector<std::string>{"conv2d", "add_", "batch_norm", "relu"}));
  ASSERT_EQ(call.outputs.size(), 1u);
  EXPECT_EQ(trace.ops()[call.outputs[0]].type, "relu");

  const Trace eval = Capture("demo");  // the mode eager PyTorch ran it in
  absl::StatusOr<std::vector<ModuleCall>> root = ModuleCalls(eval, "");
  ASSERT_TRUE(root.ok()) << root.status();
  ASSERT_EQ(root->size(), 1u);
  ASSERT_EQ((*root)[0].outputs.size(), 1u);
  const Op& last = eval.ops()[(*root)[0].outputs[0]];
  EXPECT_EQ(last.type, "log_softmax");
  EXPECT_TRUE(at::allclose(last.out, testdata::Expected("demo").output(0)));

  absl::StatusOr<std::string> described = DescribeModuleCalls(trace, "block1");
  ASSERT_TRUE(described.ok()) << described.status();
  EXPECT_THAT(*described, HasSubstr("Module block1 (ConvBlock): 1 call"));
  EXPECT_THAT(*described,
              HasSubstr(absl::StrCat("call 1: 4 ops (", trace.ops()[call.ops[0]].label, " .. ",
                                     trace.ops()[call.outputs[0]].label, "), outputs ",
                                     trace.ops()[call.outputs[0]].label)));
}

TEST(ModuleCallsTest, UnknownModuleIsNotFoundWithTheClosest) {
  const Trace trace = Capture("demo");
  absl::StatusOr<std::vector<ModuleCall>> calls = ModuleCalls(trace, "block3");
  EXPECT_EQ(calls.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(calls.status().message(), HasSubstr("block1"));
}

TEST(ModuleCallsTest, IsWithinModuleMatchesWholeNames) {
  EXPECT_TRUE(IsWithinModule("layer1.0.conv1", "layer1"));
  EXPECT_TRUE(IsWithinModule("layer1", "layer1"));
  EXPECT_TRUE(IsWithinModule("layer1", ""));
  EXPECT_FALSE(IsWithinModule("layer10", "layer1"));
  EXPECT_FALSE(IsWithinModule("layer", "layer1"));
}

}  // namespace
}  // namespace torchlens
