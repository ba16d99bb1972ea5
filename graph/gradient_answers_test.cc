// What the graph library answers about a trace's gradients: norms (per value and module)
// in the summary and the JSON, trace files that keep them, the first non-finite gradient,
// comparison and pictures. Expected values are computed here from the saved gradients
// with plain tensor arithmetic, or from the models' arithmetic.
#include <torch/script.h>
#include <torch/torch.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "graph/compare.h"
#include "graph/gradient_norms.h"
#include "graph/json_export.h"
#include "graph/non_finite.h"
#include "graph/render.h"
#include "graph/summary.h"
#include "graph/trace_file.h"
#include "graph/trace_file_writer.h"
#include "gtest/gtest.h"
#include "testdata/testdata.h"
#include "torchlens_dispatch/capture.h"
#include "validation/validate.h"

namespace torchlens {
namespace {

using ::testing::HasSubstr;

// grad_mlp (tools/gen_testdata_grads.py) on `input`, after a backward of its output's sum.
Trace GradMlp(const at::Tensor& input) {
  torch::jit::Module model = testdata::LoadModel("grad_mlp");
  CaptureOptions options;
  options.save_grads = true;
  c10::IValue out;
  absl::StatusOr<Trace> trace = TraceModule(model, {input}, options, &out);
  EXPECT_TRUE(trace.ok()) << trace.status();
  out.toTensor().sum().backward();
  return *std::move(trace);
}

Trace GradMlp() { return GradMlp(testdata::Expected("grad_mlp").input(0)); }

const Op& Node(const Trace& trace, const std::string& label) { return **trace.Find(label); }

TEST(GradientNormsTest, PerValueAndPerModule) {
  const Trace trace = GradMlp();
  const testdata::Expected expected("grad_mlp");
  const at::Tensor relu = expected.grad("relu_1_2:1");
  EXPECT_DOUBLE_EQ(*GradNorm(Node(trace, "relu_1_2:1").grad),
                   relu.to(at::kDouble).norm().item<double>());
  EXPECT_FALSE(GradNorm(at::Tensor()).has_value());
  const std::map<std::string, double> modules = ModuleGradNorms(trace);
  auto squares = [&](const std::string& param) {
    return expected.param_grad(param).to(at::kDouble).pow(2).sum().item<double>();
  };
  EXPECT_NEAR(modules.at("fc2"), std::sqrt(squares("fc2.weight") + squares("fc2.bias")), 1e-12);
  double all = 0;
  for (const char* param :
       {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias"}) {
    all += squares(param);
  }
  EXPECT_NEAR(modules.at(""), std::sqrt(all), 1e-12);
  EXPECT_EQ(modules.size(), 4u);  // the model and its three Linears
}

TEST(GradientNormsTest, SummaryAndJson) {
  const Trace trace = GradMlp();
  const std::string summary = FormatSummary(trace);
  EXPECT_THAT(summary, HasSubstr("grad norm"));
  EXPECT_THAT(summary, HasSubstr("Gradient norm per module"));
  EXPECT_THAT(summary, HasSubstr("Backward ops: 14, in execution order"));
  EXPECT_THAT(summary, HasSubstr("TanhBackward0_1   tanh_1_4:1"));
  torch::jit::Module model = testdata::LoadModel("grad_mlp");
  EXPECT_THAT(FormatSummary(*TraceModule(model, testdata::Expected("grad_mlp").inputs())),
              ::testing::Not(HasSubstr("grad norm")));

  const nlohmann::json json = nlohmann::json::parse(*TraceToJson(trace));
  EXPECT_EQ(json["records_gradients"], true);
  EXPECT_EQ(json["backward_ops"].size(), 14u);
  EXPECT_EQ(json["backward_ops"][4]["forward_label"], "tanh_1_4:1");
  EXPECT_EQ(json["backward_ops"][4]["type"], "TanhBackward0");
  for (const auto& op : json["ops"]) {
    if (op["label"] == "relu_1_2:1") {
      EXPECT_DOUBLE_EQ(op["grad_norm"].get<double>(), *GradNorm(Node(trace, "relu_1_2:1").grad));
    }
    if (op["label"] == "input_1") {
      EXPECT_TRUE(op["grad_norm"].is_null());
    }
  }
  EXPECT_DOUBLE_EQ(json["param_grad_norms"]["fc1.bias"].get<double>(),
                   *GradNorm(trace.param_grads().at("fc1.bias")));
  for (const auto& module : json["modules"]) {
    if (module["address"] == "fc3") {
      EXPECT_DOUBLE_EQ(module["grad_norm"].get<double>(), ModuleGradNorms(trace).at("fc3"));
    }
  }
}

// Saved, read back, and written again value by value: the same gradients, bit for bit, and
// they validate from the file.
TEST(GradientFilesTest, TraceFilesKeepTheGradients) {
  const Trace trace = GradMlp();
  const std::string path = absl::StrCat(::testing::TempDir(), "/grads.pt");
  for (bool streamed : {false, true}) {
    SCOPED_TRACE(streamed ? "WriteTraceFile" : "SaveTrace");
    ASSERT_TRUE((streamed ? WriteTraceFile(trace, path) : SaveTrace(trace, path)).ok());
    absl::StatusOr<Trace> loaded = LoadTrace(path);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_TRUE(loaded->records_gradients());
    for (size_t i = 0; i < trace.ops().size(); ++i) {
      const Op& a = trace.ops()[i];
      const Op& b = loaded->ops()[i];
      ASSERT_EQ(a.grad.defined(), b.grad.defined()) << a.label;
      if (a.grad.defined()) {
        EXPECT_TRUE(torch::equal(a.grad, b.grad)) << a.label;
      }
      EXPECT_EQ(a.grads.size(), b.grads.size()) << a.label;
    }
    ASSERT_EQ(loaded->backward_ops().size(), trace.backward_ops().size());
    for (size_t i = 0; i < trace.backward_ops().size(); ++i) {
      const Op& a = *trace.backward_ops()[i];
      const Op& b = *loaded->backward_ops()[i];
      EXPECT_EQ(a.label, b.label);
      EXPECT_EQ(a.forward_label, b.forward_label);
      EXPECT_EQ(a.parents, b.parents);
      EXPECT_EQ(a.children, b.children);
      EXPECT_TRUE(b.is_backward());
    }
    ASSERT_EQ(loaded->param_grads().size(), 6u);
    EXPECT_TRUE(
        torch::equal(loaded->param_grads().at("fc2.weight"), trace.param_grads().at("fc2.weight")));
    absl::StatusOr<ValidationReport> report = ValidateGradients(*loaded);
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_TRUE(report->passed);
    EXPECT_EQ(report->ops_checked, 10);
  }
}

// log of a Linear whose output is 0 where its weights and bias are: its gradient there is
// 1/0, the first non-finite one in backward order, made by log's backward from a finite one.
TEST(NonFiniteGradientTest, NamesWhereTheGradientBecameInfinite) {
  torch::nn::Sequential net(torch::nn::Linear(2, 2), torch::nn::Functional([](const at::Tensor& x) {
                              return torch::log(x.abs() + x);
                            }));
  {
    torch::NoGradGuard no_grad;
    auto linear = net[0]->as<torch::nn::Linear>();
    linear->weight.copy_(torch::tensor({{1.0f, 0.0f}, {0.0f, 0.0f}}));
    linear->bias.zero_();
  }
  CaptureOptions options;
  options.save_grads = true;
  CaptureGuard guard(*net, options);
  const at::Tensor out = net->forward(torch::tensor({{2.0f, 3.0f}}));
  absl::StatusOr<Trace> trace = guard.Finish(out);
  ASSERT_TRUE(trace.ok());
  out.sum().backward();  // log(0) = -inf forward; its input's gradient 1/0
  absl::StatusOr<std::optional<NonFiniteGradient>> first = FirstNonFiniteGradient(*trace);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(first->has_value());
  EXPECT_EQ(Node(*trace, (*first)->label).type, "add");
  EXPECT_TRUE((*first)->has_inf);
  ASSERT_EQ((*first)->readers.size(), 1u);
  EXPECT_EQ(Node(*trace, (*first)->readers[0].first).type, "log");
  EXPECT_TRUE((*first)->readers[0].second);  // a finite gradient
  EXPECT_EQ((*first)->backward_op, "AddBackward0_1");

  const Trace finite = GradMlp();
  absl::StatusOr<std::optional<NonFiniteGradient>> none = FirstNonFiniteGradient(finite);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
}

TEST(GradientCompareTest, GradientsDivergeApartFromValues) {
  const at::Tensor input = testdata::Expected("grad_mlp").input(0);
  const Trace a = GradMlp(input);
  absl::StatusOr<Comparison> same = Compare(a, GradMlp(input));
  ASSERT_TRUE(same.ok());
  EXPECT_TRUE(same->grads_compared);
  EXPECT_FALSE(same->first_gradient_divergence.has_value());
  EXPECT_EQ(same->param_grads.size(), 6u);
  // Another input: the last Linear's gradient is ones either way (the loss is a sum), and
  // tanh's the same ones through fc3's weights; fc2's output's is the first to differ.
  absl::StatusOr<Comparison> other = Compare(a, GradMlp(input * 2.0));
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->first_gradient_divergence, "linear_2_3:1");
  EXPECT_THAT(FormatComparison(*other), HasSubstr("first gradient divergence: linear_2_3:1"));
  EXPECT_THAT(FormatComparison(*other), HasSubstr("grad abs diff"));
}

TEST(GradientRenderTest, BackwardOpsBesideTheForward) {
  const Trace trace = GradMlp();
  const std::string dot = RenderDot(trace);
  EXPECT_THAT(dot, HasSubstr("cluster_backward"));
  EXPECT_THAT(dot, HasSubstr("TanhBackward0_1"));
  EXPECT_THAT(dot, HasSubstr("b4 -> b5"));  // tanh's node feeds fc2's addmm
  EXPECT_THAT(dot, HasSubstr("style=dotted, color=\"#9b6bc0\""));
  RenderOptions forward_only;
  forward_only.show_backward = false;
  EXPECT_THAT(RenderDot(trace, forward_only), ::testing::Not(HasSubstr("cluster_backward")));
}

}  // namespace
}  // namespace torchlens
