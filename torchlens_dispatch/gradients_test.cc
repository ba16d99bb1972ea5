// Gradients of captured traces (CaptureOptions::save_grads): Op::grad against eager
// PyTorch's retain_grad() values (tools/gen_testdata_grads.py), parameters' gradients
// bit-identical with and without capture, the backward ops, and what one, two or no
// backward calls leave.
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testdata/testdata.h"
#include "torchlens_dispatch/capture.h"

namespace torchlens {
namespace {

using ::testing::ElementsAre;

const std::vector<std::string>& GradModels() {
  static const auto* names =
      new std::vector<std::string>{"grad_mlp",       "grad_convbn_train", "grad_recurrent",
                                   "grad_shared_op", "grad_detached",     "grad_inplace"};
  return *names;
}

CaptureOptions WithGrads() {
  CaptureOptions options;
  options.save_grads = true;
  return options;
}

// The command-line tool's loss: the sum of every output's sum.
at::Tensor SumOfOutputs(const c10::IValue& outputs) {
  at::Tensor loss = torch::zeros({});
  if (outputs.isTensor()) return loss + outputs.toTensor().sum();
  for (const c10::IValue& value : outputs.toTupleRef().elements()) {
    loss = loss + value.toTensor().sum();
  }
  return loss;
}

struct Captured {
  torch::jit::Module model;
  Trace trace;
  c10::IValue outputs;
};

Captured Capture(const std::string& name, CaptureOptions options = WithGrads()) {
  torch::jit::Module model = testdata::LoadModel(name);
  c10::IValue outputs;
  absl::StatusOr<Trace> trace =
      TraceModule(model, testdata::Expected(name).inputs(), options, &outputs);
  EXPECT_TRUE(trace.ok()) << trace.status();
  return Captured{model, trace.ok() ? *std::move(trace) : Trace(), outputs};
}

const Op& Node(const Trace& trace, const std::string& key) {
  absl::StatusOr<const Op*> op = trace.Find(key);
  EXPECT_TRUE(op.ok()) << op.status();
  static const Op* const kNone = new Op();
  return op.ok() ? **op : *kNone;
}

TEST(GradientsTest, OpGradsAreEagerRetainGradValues) {
  for (const std::string& name : GradModels()) {
    SCOPED_TRACE(name);
    Captured captured = Capture(name);
    SumOfOutputs(captured.outputs).backward();
    const testdata::Expected expected(name);
    ASSERT_FALSE(expected.grad_labels().empty());
    for (const std::string& label : expected.grad_labels()) {
      const Op& op = Node(captured.trace, label);
      ASSERT_TRUE(op.grad.defined()) << label;
      EXPECT_TRUE(torch::equal(op.grad, expected.grad(label))) << label << "\n"
                                                               << op.grad << "\n"
                                                               << expected.grad(label);
      ASSERT_FALSE(op.grads.empty()) << label;
      EXPECT_TRUE(op.grads[0].is_same(op.grad)) << label;
    }
    for (const std::string& label : expected.unreached_labels()) {
      EXPECT_FALSE(Node(captured.trace, label).grad.defined()) << label;
      EXPECT_TRUE(Node(captured.trace, label).grads.empty()) << label;
    }
    const std::map<std::string, at::Tensor>& params = captured.trace.param_grads();
    ASSERT_EQ(params.size(), expected.param_grad_addresses().size());
    for (const std::string& address : expected.param_grad_addresses()) {
      ASSERT_EQ(params.count(address), 1u) << address;
      EXPECT_TRUE(torch::equal(params.at(address), expected.param_grad(address))) << address;
    }
  }
}

TEST(GradientsTest, DetachedBranchAndInputsWithoutGradHaveNone) {
  Captured captured = Capture("grad_detached");
  SumOfOutputs(captured.outputs).backward();
  EXPECT_FALSE(Node(captured.trace, "input_1").grad.defined());  // inputs need no grad
  EXPECT_TRUE(Node(captured.trace, "linear_1_1:1").grad.defined());
  EXPECT_FALSE(Node(captured.trace, "mul_1_4:1").grad.defined());
}

// BatchNorm's running statistics are written by its kernel (fused versions): no gradient,
// whatever its output's.
TEST(GradientsTest, FusedBufferVersionsHaveNoGradient) {
  Captured captured = Capture("grad_convbn_train");
  SumOfOutputs(captured.outputs).backward();
  int versions = 0;
  for (const Op* version : captured.trace.buffer_write_ops()) {
    ++versions;
    EXPECT_FALSE(version->grad.defined()) << version->label;
  }
  EXPECT_EQ(versions, 3);  // running_mean, running_var, num_batches_tracked
  EXPECT_TRUE(Node(captured.trace, "batch_norm_1_3:1").grad.defined());
}

// Parameters' .grad after backward() are bit-identical with and without a capture that
// collects gradients, for every gradient model and the core models that backward accepts.
TEST(GradientsTest, ParameterGradsBitIdenticalToUncapturedRun) {
  std::vector<std::string> names = GradModels();
  for (const char* core : {"mlp", "convbn_train", "loop_reuse", "call_twice", "recurrent_loop",
                           "bn2d_train", "counter_cell", "demo"}) {
    names.push_back(core);
  }
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    auto grads = [&](bool capture) {
      torch::jit::Module model = testdata::LoadModel(name);
      torch::manual_seed(3);
      c10::IValue outputs;
      if (capture) {
        EXPECT_TRUE(
            TraceModule(model, testdata::Expected(name).inputs(), WithGrads(), &outputs).ok());
      } else {
        torch::jit::GraphOptimizerEnabledGuard unoptimized(false);
        outputs = model.forward(testdata::Expected(name).inputs());
      }
      SumOfOutputs(outputs).backward();
      std::vector<at::Tensor> result;
      for (const torch::jit::NameTensor& p : model.named_parameters()) {
        result.push_back(p.value.grad().defined() ? p.value.grad().clone() : at::Tensor());
      }
      return result;
    };
    const std::vector<at::Tensor> plain = grads(false);
    const std::vector<at::Tensor> captured = grads(true);
    ASSERT_EQ(plain.size(), captured.size());
    for (size_t i = 0; i < plain.size(); ++i) {
      ASSERT_EQ(plain[i].defined(), captured[i].defined()) << i;
      if (plain[i].defined()) {
        EXPECT_TRUE(torch::equal(plain[i], captured[i])) << i;
      }
    }
  }
}

TEST(GradientsTest, BackwardOpsInExecutionOrderLinkedToTheirForwardOps) {
  Captured captured = Capture("grad_mlp");
  EXPECT_TRUE(captured.trace.backward_ops().empty());  // no backward yet
  SumOfOutputs(captured.outputs).backward();
  std::vector<std::string> types;
  std::vector<std::string> forward;
  for (const Op* op : captured.trace.backward_ops()) {
    EXPECT_TRUE(op->is_backward());
    types.push_back(op->type);
    EXPECT_FALSE(op->forward_label.empty()) << op->label;  // each linked to a forward op
    forward.push_back(op->address.empty() ? op->forward_label : op->address);
  }
  // addmm's node, then the weight's transpose (TBackward0), each parameter's accumulation
  // as soon as its gradient is complete.
  EXPECT_THAT(types, ElementsAre("AddmmBackward0", "AccumulateGrad", "TBackward0", "AccumulateGrad",
                                 "TanhBackward0", "AddmmBackward0", "AccumulateGrad", "TBackward0",
                                 "AccumulateGrad", "ReluBackward0", "AddmmBackward0",
                                 "AccumulateGrad", "TBackward0", "AccumulateGrad"));
  EXPECT_THAT(forward,
              ElementsAre("linear_3_5:1", "fc3.bias", "linear_3_5:1", "fc3.weight", "tanh_1_4:1",
                          "linear_2_3:1", "fc2.bias", "linear_2_3:1", "fc2.weight", "relu_1_2:1",
                          "linear_1_1:1", "fc1.bias", "linear_1_1:1", "fc1.weight"));
  const std::vector<const Op*> ops = captured.trace.backward_ops();
  // Gradient flows from tanh's node into fc2's addmm; fc1's addmm feeds its bias and the
  // transpose of its weight (the input needs no gradient).
  EXPECT_THAT(ops[4]->children, ElementsAre(ops[5]->label));
  EXPECT_THAT(ops[5]->parents, ElementsAre(ops[4]->label));
  EXPECT_THAT(ops[10]->children, ElementsAre(ops[11]->label, ops[12]->label));
  EXPECT_EQ(ops[0]->label, "AddmmBackward0_1");
  EXPECT_EQ(ops[0]->module_address, "fc3");
  EXPECT_EQ(ops[1]->module_address, "fc3");
  EXPECT_THAT(ops[0]->tensor_shape, ElementsAre(3, 2));
}

TEST(GradientsTest, WithoutBackwardEveryGradIsUndefined) {
  Captured captured = Capture("grad_mlp");
  for (const Op& op : captured.trace.ops()) EXPECT_FALSE(op.grad.defined()) << op.label;
  EXPECT_TRUE(captured.trace.param_grads().empty());
  EXPECT_TRUE(captured.trace.records_gradients());
  EXPECT_FALSE(Capture("grad_mlp", CaptureOptions()).trace.records_gradients());
}

// NOTE [Gradients in a trace]: a second backward replaces the first's gradients.
TEST(GradientsTest, ASecondBackwardReplacesTheFirst) {
  Captured captured = Capture("grad_shared_op");
  const at::Tensor loss = SumOfOutputs(captured.outputs);
  loss.backward({}, /*retain_graph=*/true);
  const at::Tensor first = Node(captured.trace, "relu_1_2:1").grad.clone();
  const size_t backward_ops = captured.trace.backward_ops().size();
  (loss * 3.0).backward();
  EXPECT_TRUE(torch::equal(Node(captured.trace, "relu_1_2:1").grad, first * 3.0));
  // fc's two passes add up: 3a + 3b, not quite 3 (a + b) in floating point.
  EXPECT_TRUE(torch::allclose(captured.trace.param_grads().at("fc.bias"),
                              testdata::Expected("grad_shared_op").param_grad("fc.bias") * 3.0));
  // The second call's backward ops only (the loss's own node is not the trace's).
  EXPECT_EQ(captured.trace.backward_ops().size(), backward_ops);
  EXPECT_EQ(captured.trace.backward_ops()[0]->label, "MulBackward0_1");
}

TEST(GradientsTest, GraphReadBeforeTheBackwardIsFilledByIt) {
  Captured captured = Capture("grad_mlp");
  const Op& relu = Node(captured.trace, "relu_1_2:1");  // builds the graph
  EXPECT_FALSE(relu.grad.defined());
  Trace moved = std::move(captured.trace);  // ops keep their place
  SumOfOutputs(captured.outputs).backward();
  EXPECT_TRUE(torch::equal(relu.grad, testdata::Expected("grad_mlp").grad("relu_1_2:1")));
  EXPECT_EQ(moved.backward_ops().size(), 14u);
}

TEST(GradientsTest, CopiesKeepTheGradientsTheyWereMadeWith) {
  Captured captured = Capture("grad_mlp");
  const Trace before = captured.trace;
  SumOfOutputs(captured.outputs).backward();
  const Trace after = captured.trace;
  EXPECT_FALSE(Node(before, "relu_1_2:1").grad.defined());
  EXPECT_TRUE(before.backward_ops().empty());
  EXPECT_TRUE(Node(after, "relu_1_2:1").grad.defined());
  EXPECT_EQ(after.backward_ops().size(), 14u);
  EXPECT_EQ(after.param_grads().size(), 6u);
}

TEST(GradientsTest, TraceDestroyedBeforeTheBackward) {
  torch::jit::Module model = testdata::LoadModel("grad_mlp");
  c10::IValue outputs;
  {
    absl::StatusOr<Trace> trace =
        TraceModule(model, testdata::Expected("grad_mlp").inputs(), WithGrads(), &outputs);
    ASSERT_TRUE(trace.ok());
  }
  SumOfOutputs(outputs).backward();  // the hooks find no trace, and change nothing
  EXPECT_TRUE(torch::equal(model.attr("fc1").toModule().attr("bias").toTensor().grad(),
                           testdata::Expected("grad_mlp").param_grad("fc1.bias")));
}

TEST(GradientsTest, BackwardOnAnotherThread) {
  Captured captured = Capture("grad_recurrent");
  std::thread([&] { SumOfOutputs(captured.outputs).backward(); }).join();
  const testdata::Expected expected("grad_recurrent");
  EXPECT_TRUE(torch::equal(Node(captured.trace, "buffer_1:1").grad, expected.grad("buffer_1:1")));
  EXPECT_TRUE(torch::equal(Node(captured.trace, "h:3").grad, expected.grad("buffer_1:3")));
}

// A parameter's accumulator is shared with a later forward while the first graph lives: a
// backward of that forward alone is not this trace's.
TEST(GradientsTest, AnotherForwardsBackwardIsIgnored) {
  Captured captured = Capture("grad_mlp");
  c10::IValue other = captured.model.forward(testdata::Expected("grad_mlp").inputs());
  SumOfOutputs(other).backward();
  for (const Op& op : captured.trace.ops()) EXPECT_FALSE(op.grad.defined()) << op.label;
  EXPECT_TRUE(captured.trace.backward_ops().empty());
  EXPECT_TRUE(captured.trace.param_grads().empty());
}

// The C++ frontend, against retain_grad() in the test itself. Its Linear runs `t` on the
// weight, then `addmm`.
TEST(GradientsTest, CppModuleAgainstRetainGrad) {
  torch::manual_seed(5);
  torch::nn::Sequential net(torch::nn::Linear(3, 4), torch::nn::Tanh(), torch::nn::Linear(4, 2));
  const at::Tensor x = torch::randn({2, 3});
  std::map<std::string, at::Tensor> eager;
  {
    at::Tensor a = net[0]->as<torch::nn::Linear>()->forward(x);
    at::Tensor b = torch::tanh(a);
    at::Tensor c = net[2]->as<torch::nn::Linear>()->forward(b);
    for (at::Tensor* t : {&a, &b, &c}) t->retain_grad();
    c.sum().backward();
    eager = {{"addmm_1_2:1", a.grad()},
             {"tanh_1_3:1", b.grad()},
             {"addmm_2_5:1", c.grad()},
             {"t_1_1:1", net[0]->as<torch::nn::Linear>()->weight.grad().t().clone()},
             {"t_2_4:1", net[2]->as<torch::nn::Linear>()->weight.grad().t().clone()}};
    net->zero_grad();
  }
  CaptureGuard guard(*net, WithGrads());
  at::Tensor out = net->forward(x);
  absl::StatusOr<Trace> trace = guard.Finish(out);
  ASSERT_TRUE(trace.ok()) << trace.status();
  out.sum().backward();
  for (const auto& [label, grad] : eager) {
    EXPECT_TRUE(torch::equal(Node(*trace, label).grad, grad)) << label;
  }
  EXPECT_TRUE(torch::equal(trace->param_grads().at("0.weight"),
                           net[0]->as<torch::nn::Linear>()->weight.grad()));
}

}  // namespace
}  // namespace torchlens
