// The trace as data, built by hand (graph/trace_builder.h): lookups, links, dead nodes,
// alias-write outputs and forks, without capturing anything.
#include "graph/trace.h"

#include <ATen/ATen.h>

#include <new>
#include <thread>
#include <utility>

#include "gmock/gmock.h"
#include "graph/dead_nodes.h"
#include "graph/trace_builder.h"
#include "gtest/gtest.h"

namespace torchlens {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// x -> relu -> mul(., 2) -> output; x -> sigmoid (dropped); b read and written by add_.
Trace Example() {
  TraceBuilder b;
  const at::Tensor x = at::tensor({-1.0f, 2.0f});
  const auto input = b.AddInput(x);
  const auto relu = b.AddOp("aten::relu", "", {input}, {at::relu(x)});
  b.AddOp("aten::sigmoid", "", {input}, {at::sigmoid(x)});
  const auto mul = b.AddOp("aten::mul", "Tensor", {relu, TraceBuilder::Value(at::tensor(2.0f))},
                           {at::relu(x) * 2});
  const auto read = b.AddBufferRead("b", at::zeros({2}));
  const auto add =
      b.AddOp("aten::add_", "Tensor", {read, mul, TraceBuilder::Value(1)}, {at::relu(x) * 2});
  b.AddBufferWrite("b", WriteKind::kInplace, add, at::relu(x) * 2);
  b.AddOutput(mul);
  return b.Build();
}

TEST(TraceTest, LabelsAndLookups) {
  const Trace trace = Example();
  std::vector<std::string> labels;
  for (const Op& op : trace.ops()) labels.push_back(op.label);
  EXPECT_THAT(labels, ElementsAre("input_1", "relu_1_1:1", "sigmoid_1_2:1", "mul_1_3:1",
                                  "buffer_1:1", "add__1_4:1", "buffer_1:2", "output_1"));
  EXPECT_EQ(trace.IndexOfLabel("mul_1_3:1"), 3);
  EXPECT_EQ(trace.IndexOfLabel("mul_1_3"), -1);  // exact labels only
  for (const auto& [key, label] : {std::pair{"mul_1_3", "mul_1_3:1"}, {"b:2", "buffer_1:2"}}) {
    absl::StatusOr<const Op*> found = trace.Find(key);
    ASSERT_TRUE(found.ok()) << found.status();
    EXPECT_EQ((*found)->label, label);
  }
  EXPECT_THAT(std::string(trace.Find("b").status().message()), HasSubstr("2 versions"));
  EXPECT_THAT(std::string(trace.Find("mull_1_3:1").status().message()), HasSubstr("mul_1_3:1"));
  EXPECT_EQ(trace.buffers().at("b").num_overwrites, 1);
  EXPECT_TRUE(at::equal(*trace.buffers().at("b").value_after(1), at::tensor({0.0f, 4.0f})));
}

TEST(TraceTest, AssembleLinksChildrenAndIndices) {
  const Trace trace = Example();
  const Op& input = trace.ops()[0];
  EXPECT_THAT(input.children, ElementsAre("relu_1_1:1", "sigmoid_1_2:1"));
  EXPECT_THAT(input.child_indices, ElementsAre(1, 2));
  const Op& add = trace.ops()[5];
  EXPECT_THAT(add.parents, ElementsAre("buffer_1:1", "mul_1_3:1"));
  EXPECT_THAT(add.parent_indices, ElementsAre(4, 3));
  EXPECT_EQ(add.kind, OpKind::kOp);
  EXPECT_TRUE(trace.ops()[4].is_buffer);
  EXPECT_EQ(trace.ops()[4].kind, OpKind::kBufferVersion);
  EXPECT_EQ(OpKindOf("constant", false), OpKind::kConstant);
}

TEST(TraceTest, DeadNodesAreThoseNothingDependsOn) {
  const Trace trace = Example();
  // sigmoid reaches nothing; the buffer write is a sink, so add_ and its read are live.
  EXPECT_THAT(DeadNodes(trace), ElementsAre(2));
}

TEST(TraceTest, OutputValueNamesOutputsAndAliasWrites) {
  TraceBuilder b;
  const at::Tensor x = at::zeros({2, 2});
  const auto input = b.AddInput(x);
  const auto row = b.AddOp("aten::select", "int",
                           {input, TraceBuilder::Value(0), TraceBuilder::Value(0)}, {x[0]});
  AliasWrite write;
  write.before = ArgSource{ArgSource::Kind::kNode, "input_1", 0};
  write.value = at::tensor({1.0f, 1.0f, 0.0f, 0.0f}).reshape({2, 2});
  const auto fill =
      b.AddOp("aten::fill_", "Scalar", {row, TraceBuilder::Value(1.0)}, {at::ones({2})}, {write});
  b.AddOutput(TraceBuilder::Ref{fill.node, -1, {}});
  const Trace trace = b.Build();
  const Op& op = trace.ops()[fill.node];
  EXPECT_TRUE(at::equal(OutputValue(op, 0), at::ones({2})));
  EXPECT_TRUE(at::equal(OutputValue(op, -1), write.value));
  EXPECT_FALSE(OutputValue(op, -2).defined());
  EXPECT_FALSE(OutputValue(op, 1).defined());
  EXPECT_THAT(op.parents, ElementsAre("select_1_1:1", "input_1"));
  EXPECT_TRUE(at::equal(trace.ops().back().out, write.value));
}

TEST(TraceTest, PartsAndAssembleMakeAnEqualForkThatSharesTensors) {
  const Trace trace = Example();
  const Trace fork = Trace::Assemble(trace.Parts());
  ASSERT_EQ(fork.ops().size(), trace.ops().size());
  for (size_t i = 0; i < trace.ops().size(); ++i) {
    EXPECT_EQ(fork.ops()[i].label, trace.ops()[i].label);
    EXPECT_EQ(fork.ops()[i].parent_indices, trace.ops()[i].parent_indices);
    EXPECT_EQ(fork.ops()[i].out.unsafeGetTensorImpl(), trace.ops()[i].out.unsafeGetTensorImpl());
  }
  // The fork's buffer projections point into the fork.
  EXPECT_EQ(fork.IndexOf(fork.buffers().at("b").versions[1]), 6);
  EXPECT_EQ(trace.IndexOf(fork.buffers().at("b").versions[1]), -1);
}

// NOTE [Graphs built on first use]: a build that throws leaves an empty, partial graph,
// and every later read, from any thread, returns instead of waiting for a build that
// will never end.
TEST(TraceTest, AGraphWhoseBuildThrowsIsEmptyAndPartial) {
  const Trace source = Example();
  TraceParts known = source.Parts();
  known.ops.clear();
  known.buffers.clear();
  int builds = 0;
  Trace trace = Trace::Deferred(std::move(known), /*partial=*/false, [&builds]() -> TraceParts {
    ++builds;
    throw std::bad_alloc();
  });
  EXPECT_FALSE(trace.partial());  // nothing tried yet
  EXPECT_TRUE(trace.ops().empty());
  EXPECT_TRUE(trace.partial());
  EXPECT_THAT(trace.partial_reason(), HasSubstr("building this trace's graph failed"));
  ASSERT_EQ(trace.diagnostics().size(), 1u);
  EXPECT_EQ(trace.diagnostics()[0].message, trace.partial_reason());
  EXPECT_EQ(trace.Find("relu_1_1:1").status().code(), absl::StatusCode::kNotFound);
  std::thread other([&trace] { EXPECT_TRUE(trace.buffers().empty()); });
  other.join();
  EXPECT_EQ(builds, 1);
  // Known without the graph, kept.
  EXPECT_EQ(trace.has_saved_values(), source.has_saved_values());
}

// A deferred graph is built once, by the first read, and moves with its trace.
TEST(TraceTest, ADeferredGraphIsBuiltOnceByTheFirstRead) {
  const Trace source = Example();
  int builds = 0;
  Trace trace = Trace::Deferred(TraceParts(), /*partial=*/false, [&]() -> TraceParts {
    ++builds;
    return source.Parts();
  });
  EXPECT_EQ(builds, 0);
  Trace moved = std::move(trace);
  EXPECT_EQ(builds, 0);
  EXPECT_EQ(moved.ops().size(), source.ops().size());
  EXPECT_EQ(moved.Find("relu_1_1:1").value()->label, "relu_1_1:1");
  EXPECT_EQ(moved.buffers().at("b").num_overwrites, 1);
  EXPECT_EQ(builds, 1);
  EXPECT_FALSE(trace.partial());     // NOLINT(bugprone-use-after-move): moved-from is empty
  EXPECT_TRUE(trace.ops().empty());  // NOLINT(bugprone-use-after-move)
}

}  // namespace
}  // namespace torchlens
