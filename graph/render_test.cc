// DOT structure for each ShowBuffers mode, and in-process rendering through Graphviz.
#include "graph/render.h"

#include <torch/script.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testdata/testdata.h"
#include "testdata/trace_testing.h"
#include "torchlens_dispatch/capture.h"

namespace torchlens {
namespace {

using ::torchlens::testing_util::Capture;

using ::testing::HasSubstr;
using ::testing::Not;

int Count(const std::string& text, const std::string& needle) {
  int count = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) {
    ++count;
  }
  return count;
}

// The DOT statement of the node showing `label`.
std::string NodeLine(const std::string& dot, const std::string& label) {
  std::istringstream lines(dot);
  for (std::string line; std::getline(lines, line);) {
    if (line.find("label=\"" + label + "\\n") != std::string::npos) return line;
  }
  return "";
}

// An eval-mode BatchNorm beside an architectural buffer (causal_mask) used in the forward.
TEST(RenderTest, MeaningfulShowsArchitecturalBuffersAndMarksHiddenOnes) {
  const Trace trace = Capture("causal_mask_bn");
  const std::string dot = RenderDot(trace);  // kMeaningful
  EXPECT_EQ(Count(dot, "shape=cylinder"), 1);
  EXPECT_THAT(dot, HasSubstr("causal_mask:1\\nread"));
  EXPECT_THAT(dot, Not(HasSubstr("running_mean:1\\n")));
  const std::string bn = NodeLine(dot, "batch_norm_1_2:1");
  ASSERT_FALSE(bn.empty()) << dot;
  EXPECT_THAT(bn, HasSubstr("peripheries=2"));
  // The tooltip's first line; the statement's source position follows.
  EXPECT_THAT(bn, HasSubstr("tooltip=\"Hidden buffers: bn.running_mean:1, bn.running_var:1\\n"));
  EXPECT_THAT(bn, HasSubstr("torch/nn/functional.py:"));
  EXPECT_THAT(NodeLine(dot, "matmul_1_1:1"), Not(HasSubstr("peripheries")));
  // bn draws one node here: it is not framed, and its node names it.
  EXPECT_THAT(dot, Not(HasSubstr("cluster_bn")));
  EXPECT_THAT(bn, HasSubstr("@bn"));
  EXPECT_THAT(bn, HasSubstr("params: weight [4], bias [4]"));
}

TEST(RenderTest, AlwaysShowsEveryBufferWithoutMarkers) {
  const Trace trace = Capture("causal_mask_bn");
  const std::string dot = RenderDot(trace, RenderOptions{ShowBuffers::kAlways});
  EXPECT_EQ(Count(dot, "shape=cylinder"), 3);
  EXPECT_THAT(dot, HasSubstr("bn.running_mean:1\\nread"));
  EXPECT_THAT(dot, HasSubstr("bn.running_var:1\\nread"));
  EXPECT_THAT(dot, Not(HasSubstr("peripheries")));
  EXPECT_THAT(dot, Not(HasSubstr("Hidden buffers")));
  // With its buffer versions, bn draws three nodes: a cluster frames them.
  EXPECT_THAT(dot, HasSubstr("subgraph \"cluster_bn\""));
  EXPECT_THAT(dot, HasSubstr("label=\"bn (BatchNorm1d)\""));
}

TEST(RenderTest, NeverShowsNoBuffer) {
  const Trace trace = Capture("causal_mask_bn");
  const std::string dot = RenderDot(trace, RenderOptions{ShowBuffers::kNever});
  EXPECT_EQ(Count(dot, "shape=cylinder"), 0);
  EXPECT_THAT(NodeLine(dot, "matmul_1_1:1"),
              HasSubstr("tooltip=\"Hidden buffers: causal_mask:1\\n"));
}

TEST(RenderTest, HiddenWrittenVersionKeepsTheFlowAsADashedEdge) {
  const Trace trace = Capture("seed_recurrent");
  const std::string dot = RenderDot(trace, RenderOptions{ShowBuffers::kNever});
  EXPECT_EQ(Count(dot, "[style=dashed]"), 2);  // tanh -> add, tanh -> output
  EXPECT_EQ(Count(RenderDot(trace), "shape=cylinder"), 3);
}

TEST(RenderTest, SvgHasOneNodePerVisibleOp) {
  const Trace trace = Capture("causal_mask_bn");
  const std::string path = absl::StrCat(testing::TempDir(), "/graph.svg");
  absl::Status status = RenderToFile(trace, path);
  ASSERT_TRUE(status.ok()) << status;
  std::ifstream file(path);
  const std::string svg((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  EXPECT_THAT(svg, HasSubstr("<svg"));
  EXPECT_THAT(svg, HasSubstr("</svg>"));
  // 9 nodes minus the two hidden running statistics.
  EXPECT_EQ(Count(svg, "class=\"node\""), static_cast<int>(trace.ops().size()) - 2);
  for (const char* format : {"png", "pdf"}) {
    const std::string other = absl::StrCat(testing::TempDir(), "/graph.", format);
    ASSERT_TRUE(RenderToFile(trace, other).ok());
    EXPECT_GT(std::ifstream(other, std::ios::ate).tellg(), 1000);
  }
  EXPECT_EQ(RenderToFile(trace, "graph.gif").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RenderToFile(trace, "/nonexistent/dir/graph.svg").code(), absl::StatusCode::kNotFound);
  // A failed write is a status: Graphviz's own file output ended the process instead.
  for (const char* format : {"svg", "png", "pdf"}) {
    const std::string full = absl::StrCat(testing::TempDir(), "/full.", format);
    ASSERT_EQ(::symlink("/dev/full", full.c_str()), 0);
    const absl::Status status = RenderToFile(trace, full);
    EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << format;
    EXPECT_THAT(std::string(status.message()), HasSubstr("No space left on device")) << format;
  }
}

TEST(RenderTest, DeadComputationIsDottedOrHiddenAndConstantsAreNotes) {
  const Trace trace = Capture("dead_branch");  // sigmoid(y) * 2 is computed and dropped
  const std::string dot = RenderDot(trace);
  EXPECT_THAT(NodeLine(dot, "sigmoid_1_3:1"), HasSubstr("dotted"));
  EXPECT_THAT(NodeLine(dot, "relu_1_2:1"), Not(HasSubstr("dotted")));
  RenderOptions live_only;
  live_only.show_dead = false;
  const std::string hidden = RenderDot(trace, live_only);
  EXPECT_EQ(NodeLine(hidden, "sigmoid_1_3:1"), "");
  EXPECT_EQ(NodeLine(hidden, "mul_1_4:1"), "");
  EXPECT_NE(NodeLine(hidden, "relu_1_2:1"), "");
  EXPECT_EQ(Count(hidden, " -> "), Count(dot, " -> ") - 2);  // y -> sigmoid -> mul

  const std::string attribute = RenderDot(Capture("plain_attribute"));
  const std::string scale = NodeLine(attribute, "constant_1");
  EXPECT_THAT(scale, HasSubstr("shape=note"));
  EXPECT_THAT(scale, HasSubstr("\\nscale"));
}

// Demo (tools/gen_testdata.py): stem, block1 and block2 (conv, bn, relu each), head,
// between root ops. At depth 1 each of the four top-level modules is one box.
TEST(RenderTest, DepthLimitCollapsesModulesIntoBoxesWithTheirOpCounts) {
  const Trace trace = Capture("demo");
  RenderOptions collapsed;
  collapsed.max_module_depth = 1;
  const std::string dot = RenderDot(trace, collapsed);
  EXPECT_EQ(Count(dot, "shape=box3d"), 4) << dot;
  EXPECT_THAT(dot, HasSubstr("label=\"block1 (ConvBlock)\\n3 ops\""));
  EXPECT_THAT(dot, HasSubstr("label=\"block2 (ConvBlock)\\n3 ops\""));
  EXPECT_THAT(dot, HasSubstr("label=\"stem (Conv2d)\\n1 op\""));
  EXPECT_THAT(dot, HasSubstr("label=\"head (Linear)\\n1 op\""));
  // Every node the full picture draws outside those modules is still drawn.
  const std::string full = RenderDot(trace);
  int inside = 0;
  for (const Op& op : trace.ops()) {
    inside += BufferShown(op, ShowBuffers::kMeaningful) && !op.module_address.empty() &&
              !op.is_input() && !op.is_output();
  }
  EXPECT_EQ(Count(dot, "[shape="), Count(full, "[shape=") - inside + 4);
  EXPECT_THAT(dot, Not(HasSubstr("cluster_block1")));
}

// LoopReuse: a TorchScript loop runs cell (linear, tanh) three times.
TEST(RenderTest, RolledViewDrawsEachLayerOnceWithItsPasses) {
  const Trace trace = Capture("loop_reuse");
  RenderOptions rolled;
  rolled.rolled = true;
  const std::string dot = RenderDot(trace, rolled);
  EXPECT_EQ(Count(dot, "[shape="), 4) << dot;  // input, linear, tanh, output
  EXPECT_EQ(Count(dot, "3 passes"), 2) << dot;
  EXPECT_EQ(Count(dot, " -> "), 4) << dot;  // input->linear, linear->tanh, tanh->linear, ->out

  RenderOptions boxes;
  boxes.max_module_depth = 1;
  const std::string unrolled = RenderDot(trace, boxes);
  EXPECT_EQ(Count(unrolled, "shape=box3d"), 3) << unrolled;
  for (int call = 1; call <= 3; ++call) {
    EXPECT_THAT(unrolled, HasSubstr(absl::StrCat("cell (Cell)\\n2 ops, call ", call, " of 3")));
  }
  boxes.rolled = true;
  const std::string one_box = RenderDot(trace, boxes);
  EXPECT_EQ(Count(one_box, "shape=box3d"), 1) << one_box;
  EXPECT_THAT(one_box, HasSubstr("cell (Cell)\\n6 ops, 3 calls"));
}

// A rolled buffer says what its versions are: counter_cell reads b, then writes it in
// place on each of its three passes.
TEST(RenderTest, RolledBufferKeepsItsWrites) {
  const Trace trace = Capture("counter_cell");
  RenderOptions rolled;
  rolled.rolled = true;
  const std::string dot = RenderDot(trace, rolled);
  EXPECT_THAT(dot, HasSubstr("label=\"b\\nread, 3 writes (inplace) [4]\\n4 versions\""));
  EXPECT_THAT(dot, Not(HasSubstr("label=\"b\\nread [4]")));
}

// In training BatchNorm counts batches with num_batches_tracked.add_(1): meaningful hides
// that add_ with the counter it updates, instead of drawing it unconnected.
TEST(RenderTest, MeaningfulHidesTheBatchCounterUpdate) {
  const Trace trace = Capture("bn2d_train");
  const std::string meaningful = RenderDot(trace);
  EXPECT_THAT(meaningful, Not(HasSubstr("\\nadd_ []")));
  EXPECT_EQ(Count(meaningful, "shape=cylinder"), 0);
  const std::string always = RenderDot(trace, RenderOptions{ShowBuffers::kAlways});
  EXPECT_EQ(Count(always, "\\nadd_ []"), 1);
  EXPECT_THAT(always, HasSubstr("bn.num_batches_tracked:2\\ninplace"));
}

// The branches inside PyTorch's own code (BatchNorm's `if self.training`) label ops only
// on request; a model's own branches always do.
TEST(RenderTest, LibraryBranchesOnRequest) {
  const Trace trace = Capture("bn2d_train");
  RenderOptions always{ShowBuffers::kAlways};
  EXPECT_THAT(RenderDot(trace, always), Not(HasSubstr("of if at batchnorm.py")));
  always.library_branches = true;
  EXPECT_THAT(RenderDot(trace, always), HasSubstr("of if at batchnorm.py"));
  EXPECT_THAT(RenderDot(Capture("branchy")), HasSubstr("of if at gen_testdata.py"));
}

}  // namespace
}  // namespace torchlens
