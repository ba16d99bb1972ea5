// Writes through views under CaptureGuard: C++ frontend modules and TorchScript modules
// defined in C++ running their own executor, with autograd on. Expected values are hand
// arithmetic.
#include <torch/script.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testdata/trace_testing.h"
#include "torchlens_dispatch/capture.h"
#include "torchlens_dispatch/capture_options.h"
#include "validation/intervene.h"
#include "validation/validate.h"

namespace torchlens {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::torchlens::testing_util::Get;

Trace CaptureNn(torch::nn::Module& net, const std::function<torch::Tensor()>& forward) {
  CaptureGuard guard(net);
  const torch::Tensor out = forward();
  absl::StatusOr<Trace> trace = guard.Finish(out);
  EXPECT_TRUE(trace.ok()) << trace.status();
  return trace.ok() ? *std::move(trace) : Trace();
}

void ExpectValid(const Trace& trace) {
  absl::StatusOr<ValidationReport> report = ValidateForwardPass(trace);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->passed) << absl::StrJoin(report->failures, "\n");
  EXPECT_THAT(report->dead, IsEmpty());
}

TEST(ViewsTest, FillThroughAnUnsqueezedViewOfALinearOutput) {
  torch::nn::Linear lin(3, 3);
  const torch::Tensor x = torch::randn({2, 3});
  const Trace trace = CaptureNn(*lin, [&] {
    torch::Tensor h = lin->forward(x);  // requires grad: saved detached
    h.unsqueeze(0).fill_(0.5);
    return h * 2.0;
  });
  EXPECT_TRUE(at::equal(Get(trace, "output_1").out, torch::full({2, 3}, 1.0)));
  // The C++ frontend's Linear runs t and addmm.
  EXPECT_THAT(Get(trace, "mul_1_5:1").parents, ElementsAre("fill__1_4:1"));
  ExpectValid(trace);
  // An edit upstream of the write is overwritten by it: the output stays 1.
  absl::StatusOr<DoResult> result =
      Do(trace, {Edit{"addmm_1_2:1", torch::full({2, 3}, 7.0)}}, DoOptions{true});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(at::equal(Get(result->trace, "output_1").out, torch::full({2, 3}, 1.0)));
}

// NOTE [Writes through aliases]: an edit of a view that is then written in place is an
// edit of those bytes of its base, as in eager PyTorch where the two share memory.
TEST(ViewsTest, AnEditOfAWrittenViewReachesItsBase) {
  torch::nn::Module net;
  const torch::Tensor x = torch::randn({3, 4});
  const Trace trace = CaptureNn(net, [&] {
    torch::Tensor base = x * 1;
    torch::Tensor row = base.select(0, 1);
    row.add_(1);
    return base.sum(1);
  });
  ExpectValid(trace);
  absl::StatusOr<DoResult> result =
      Do(trace, {Edit{"select_1_2:1", torch::full({4}, 0.5)}}, DoOptions{true});
  ASSERT_TRUE(result.ok()) << result.status();
  // By hand: the row becomes 0.5 + 1 = 1.5 and the other rows keep x's values.
  torch::Tensor expected = x.clone();
  expected.select(0, 1).fill_(1.5);
  EXPECT_TRUE(at::allclose(Get(result->trace, "output_1").out, expected.sum(1)));
  EXPECT_THAT(result->warnings, IsEmpty());
}

// NOTE [Edits of views]: what reads the base itself after the view was made keeps its
// captured value, and the edit says so.
TEST(ViewsTest, AnEditOfAViewNamesTheBasesReadersItDoesNotReach) {
  torch::nn::Module net;
  const torch::Tensor x = torch::randn({3, 4});
  const Trace trace = CaptureNn(net, [&] {
    torch::Tensor base = x * 1;
    torch::Tensor row = base.select(0, 1);
    torch::Tensor totals = base.sum(1);  // sum_1_3:1 reads the base after the view
    return totals + row.sum();
  });
  ExpectValid(trace);
  absl::StatusOr<DoResult> result = Do(trace, {Edit{"select_1_2:1", torch::full({4}, 0.5)}});
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->warnings.size(), 1u);
  EXPECT_EQ(result->warnings[0].kind, DiagnosticKind::kAliasWriteGap);
  EXPECT_EQ(result->warnings[0].label, "select_1_2:1");
  EXPECT_THAT(result->warnings[0].message,
              ::testing::HasSubstr("does not reach what reads mul_1_1:1 after it (sum_1_3:1)"));
  // Strict: the same gap is an error.
  EXPECT_EQ(
      Do(trace, {Edit{"select_1_2:1", torch::full({4}, 0.5)}}, DoOptions{true}).status().code(),
      absl::StatusCode::kFailedPrecondition);
  // An edit of the base itself reaches every reader.
  absl::StatusOr<DoResult> of_base = Do(trace, {Edit{"mul_1_1:1", torch::ones({3, 4})}});
  ASSERT_TRUE(of_base.ok()) << of_base.status();
  EXPECT_THAT(of_base->warnings, IsEmpty());
  EXPECT_TRUE(at::allclose(Get(of_base->trace, "output_1").out, torch::full({3}, 8.0)));
}

TEST(ViewsTest, PartialWritesThroughSeveralViewsAndAViewOfAView) {
  torch::nn::Module net;
  const torch::Tensor x = torch::arange(6.0).reshape({2, 3});
  const Trace trace = CaptureNn(net, [&] {
    torch::Tensor h = x * 1.0;                              // [[0,1,2],[3,4,5]]
    h.select(0, 0).add_(10.0);                              // [[10,11,12],[3,4,5]]
    h.select(1, 2).mul_(2.0);                               // [[10,11,24],[3,4,10]]
    h.view({3, 2}).narrow(0, 2, 1).select(1, 0).sub_(1.0);  // element [1][1]: 4 -> 3
    return h + 0.0;
  });
  EXPECT_TRUE(at::equal(Get(trace, "output_1").out,
                        torch::tensor({{10.0, 11.0, 24.0}, {3.0, 3.0, 10.0}}, torch::kFloat)));
  ExpectValid(trace);
  // Edit the base before any write: every write is redone on it.
  absl::StatusOr<DoResult> result =
      Do(trace, {Edit{"mul_1_1:1", torch::ones({2, 3})}}, DoOptions{true});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(at::equal(Get(result->trace, "output_1").out,
                        torch::tensor({{11.0, 11.0, 22.0}, {1.0, 0.0, 2.0}}, torch::kFloat)));
}

TEST(ViewsTest, EdgesFollowWritesThroughViewsWithoutSavedValues) {
  torch::nn::Module net;
  const torch::Tensor x = torch::arange(6.0).reshape({2, 3});
  for (bool save : {true, false}) {
    SCOPED_TRACE(save);
    CaptureOptions options;
    options.save_activations = save;
    CaptureGuard guard(net, options);
    torch::Tensor h = x * 1.0;
    torch::Tensor row = h.select(0, 1);  // taken before the writes
    h.select(0, 0).add_(10.0);           // does not touch row
    h.select(1, 2).mul_(2.0);            // touches row's last element
    torch::Tensor out = row + h;
    absl::StatusOr<Trace> trace = guard.Finish(out);
    ASSERT_TRUE(trace.ok()) << trace.status();
    // mul_ wrote both h and row; add_ reads both as mul_'s alias writes.
    EXPECT_THAT(Get(*trace, "add_1_7:1").parents, ElementsAre("mul__1_6:1"));
    // The column view is taken from h after add_ wrote it.
    EXPECT_THAT(Get(*trace, "add__1_4:1").children, ElementsAre("select_3_5:1", "mul__1_6:1"));
  }
}

TEST(ViewsTest, RegisteredBufferWrittenThroughATransposeInCpp) {
  struct NetImpl : torch::nn::Module {
    NetImpl() { b = register_buffer("b", torch::zeros({2, 2})); }
    torch::Tensor forward(torch::Tensor x) {
      b.t().copy_(x);
      return b * 1.0;
    }
    torch::Tensor b;
  };
  auto net = std::make_shared<NetImpl>();
  const torch::Tensor x = torch::tensor({{1.0, 2.0}, {3.0, 4.0}}, torch::kFloat);
  const Trace trace = CaptureNn(*net, [&] { return net->forward(x); });
  const Buffer& b = trace.buffers().at("b");
  ASSERT_EQ(b.num_overwrites, 1);
  EXPECT_TRUE(at::equal(*b.value_after(1), x.t()));
  ExpectValid(trace);
  absl::StatusOr<DoResult> result = Do(trace, {Edit{"input_1", x * 2}}, DoOptions{true});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(at::equal(result->trace.buffers().at("b").final_value, x.t() * 2));
}

// NOTE [Writes through views of another dtype]: a float view of an int32 buffer and a
// byte view of a half one, written in place, are redone bit for bit, and an edit reaches
// them (TorchScript in LibTorch 1.13 cannot export `view(dtype)`: it takes the dtype for
// a size, so this is a C++ module).
TEST(ViewsTest, BufferWrittenThroughAViewOfAnotherDtypeInCpp) {
  struct NetImpl : torch::nn::Module {
    NetImpl() {
      b = register_buffer("b", torch::zeros({2, 2}, torch::kInt32));
      h = register_buffer("h", torch::ones({2}, torch::kHalf));
    }
    torch::Tensor forward(torch::Tensor x) {
      b.view(torch::kFloat)[1].copy_(x);
      b.view(torch::kFloat).mul_(2.0);
      h.view(torch::kByte)[1].fill_(0);  // h[0]'s high byte (1.0 is 0x3C00): h = [0, 1]
      return b.view(torch::kFloat) + h.to(torch::kFloat).sum();
    }
    torch::Tensor b;
    torch::Tensor h;
  };
  auto net = std::make_shared<NetImpl>();
  const torch::Tensor x = torch::tensor({3.0f, 5.0f});
  const Trace trace = CaptureNn(*net, [&] { return net->forward(x); });
  // b as floats: [[0, 0], [6, 10]].
  EXPECT_TRUE(at::equal(trace.buffers().at("b").final_value.view(torch::kFloat),
                        torch::tensor({{0.0f, 0.0f}, {6.0f, 10.0f}})));
  EXPECT_TRUE(
      at::equal(trace.buffers().at("h").final_value, torch::tensor({0.0f, 1.0f}).to(torch::kHalf)));
  absl::StatusOr<ValidationReport> report = ValidateForwardPass(trace);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->passed) << absl::StrJoin(report->failures, "\n");
  EXPECT_THAT(report->state_transition_only, IsEmpty());
  absl::StatusOr<DoResult> result = Do(trace, {Edit{"input_1", x * 2}}, DoOptions{true});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(at::equal(result->trace.buffers().at("b").final_value.view(torch::kFloat),
                        torch::tensor({{0.0f, 0.0f}, {12.0f, 20.0f}})));
  EXPECT_TRUE(
      at::equal(Get(result->trace, "output_1").out, torch::tensor({{1.0f, 1.0f}, {13.0f, 21.0f}})));
}

// NOTE [Parameters written through views]: a C++ module whose parameter (requiring grad)
// is written through a view between two reads; the second read sees the write, the first
// keeps what it read, and an edit is carried through both.
TEST(ViewsTest, ParameterWrittenThroughAViewInCpp) {
  struct NetImpl : torch::nn::Module {
    NetImpl() { w = register_parameter("w", torch::tensor({1.0f, 2.0f, 3.0f})); }
    torch::Tensor forward(torch::Tensor x) {
      torch::Tensor before = x * w;
      {
        torch::NoGradGuard no_grad;
        w.narrow(0, 1, 2).mul_(x.narrow(0, 0, 2));
      }
      return before + x * w;
    }
    torch::Tensor w;
  };
  auto net = std::make_shared<NetImpl>();
  const torch::Tensor x = torch::tensor({2.0f, 10.0f, 1.0f});
  const Trace trace = CaptureNn(*net, [&] { return net->forward(x); });
  // w becomes [1, 4, 30]: [2, 20, 3] + [2, 40, 30].
  EXPECT_TRUE(at::equal(Get(trace, "output_1").out, torch::tensor({4.0f, 60.0f, 33.0f})));
  EXPECT_TRUE(at::equal(net->w.detach(), torch::tensor({1.0f, 4.0f, 30.0f})));
  EXPECT_THAT(Get(trace, "mul_1_1:1").parents, ElementsAre("input_1"));
  EXPECT_THAT(Get(trace, "mul_1_1:1").parent_params, ElementsAre("w"));
  ExpectValid(trace);
  // x = [1, 1, 1]: w becomes [1, 2, 3], and the output is [1, 2, 3] + [1, 2, 3].
  absl::StatusOr<DoResult> result = Do(trace, {Edit{"input_1", torch::ones({3})}}, DoOptions{true});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(at::equal(Get(result->trace, "output_1").out, torch::tensor({2.0f, 4.0f, 6.0f})));
}

TEST(ViewsTest, ScriptModuleDefinedInCppUnderItsOwnExecutor) {
  torch::jit::Module m("m");
  m.register_buffer("h", torch::zeros({2}));
  m.define(R"JIT(
    def forward(self, x):
        y = x * 3.0
        y[0].add_(1.0)
        self.h.copy_(y)
        self.h[1:].mul_(2.0)
        return self.h + y
  )JIT");
  const torch::Tensor x = torch::tensor({1.0, 2.0}, torch::kFloat);
  CaptureGuard guard(m);
  const c10::IValue out = m.forward({x});
  absl::StatusOr<Trace> trace = guard.Finish(out);
  ASSERT_TRUE(trace.ok()) << trace.status();
  // y = [4, 6]; h = [4, 12]; out = [8, 18].
  EXPECT_TRUE(at::equal(Get(*trace, "output_1").out, torch::tensor({8.0f, 18.0f})));
  EXPECT_EQ(trace->buffers().at("h").num_overwrites, 2);
  ExpectValid(*trace);
}

TEST(ViewsTest, PlainTensorAttributeIsANamedConstantUnderCaptureGuard) {
  torch::jit::Module m("m");
  m.register_attribute("scale", c10::TensorType::get(), torch::tensor({2.0f, 3.0f}));
  m.define(R"JIT(
    def forward(self, x):
        return x * self.scale
  )JIT");
  const torch::Tensor x = torch::ones({2});
  CaptureGuard guard(m);
  const c10::IValue out = m.forward({x});
  absl::StatusOr<Trace> trace = guard.Finish(out);
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_THAT(Get(*trace, "mul_1_1:1").parents, ElementsAre("input_1", "constant_1"));
  EXPECT_EQ(Get(*trace, "constant_1").address, "scale");
  EXPECT_THAT(trace->buffers(), IsEmpty());
  ExpectValid(*trace);
}

// Layouts whose values replay or perturbation may not handle: validation gives a verdict
// naming what it could not do, never an exception or a raw LibTorch message.
TEST(ViewsTest, SparseQuantizedAndMetaTensorsGetAVerdict) {
  torch::nn::Module net;
  const torch::Tensor x = torch::tensor({{0.0f, 1.5f}, {-2.0f, 0.0f}});
  const torch::Tensor meta = torch::empty({2, 2}, torch::kMeta);
  const Trace trace = CaptureNn(net, [&] {
    torch::Tensor sparse = x.to_sparse() * 2.0;
    torch::Tensor quantized = torch::quantize_per_tensor(x, 0.5, 4, torch::kQUInt8);
    torch::Tensor on_meta = meta + 1.0;  // dead, still replayed
    return sparse.to_dense() + quantized.dequantize();
  });
  absl::StatusOr<ValidationReport> report = ValidateForwardPass(trace);
  ASSERT_TRUE(report.ok()) << report.status();
  // 2x + x (x is exactly representable at scale 0.5).
  EXPECT_TRUE(at::equal(Get(trace, "output_1").out, x * 3.0));
  for (const std::string& line : report->failures) ADD_FAILURE() << line;
  EXPECT_TRUE(report->passed);
}

}  // namespace
}  // namespace torchlens
