// A captured trace builds its graph when first read (NOTE [Graphs built on first use] in
// graph/trace.h): what a reader sees must not depend on when or where that happens. The
// expected values are the eager forward's, recomputed here from the model's weights.
#include <torch/torch.h>

#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testdata/trace_testing.h"
#include "torchlens_dispatch/capture.h"

namespace torchlens {
namespace {

using ::torchlens::testing_util::Get;
using ::torchlens::testing_util::Labels;

using ::testing::ElementsAre;

// Two layers and a counter written in place: labels, edges, a buffer with two versions.
struct CounterNetImpl : torch::nn::Module {
  CounterNetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(4, 3));
    fc2 = register_module("fc2", torch::nn::Linear(3, 2));
    calls = register_buffer("calls", torch::zeros({1}));
  }
  torch::Tensor forward(torch::Tensor x) {
    calls.add_(1.0);
    return fc2(torch::relu(fc1(x)));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::Tensor calls;
};
TORCH_MODULE(CounterNet);

const std::vector<std::string> kComputeLabels = {"add__1_1:1", "t_1_2:1", "addmm_1_3:1",
                                                 "relu_1_4:1", "t_2_5:1", "addmm_2_6:1"};

std::vector<std::string> ComputeLabels(const Trace& trace) {
  std::vector<std::string> labels;
  for (const Op& op : trace.ops()) {
    if (op.is_compute()) labels.push_back(op.label);
  }
  return labels;
}

absl::StatusOr<Trace> Capture(CounterNet& net, const torch::Tensor& x) {
  CaptureGuard guard(*net);
  guard.MarkInputs(x);
  return guard.Finish(net->forward(x));
}

TEST(DeferredGraphTest, ConcurrentFirstReadsSeeOneGraph) {
  torch::manual_seed(0);
  CounterNet net;
  const torch::Tensor x = torch::randn({2, 4});
  absl::StatusOr<Trace> trace = Capture(net, x);
  ASSERT_TRUE(trace.ok()) << trace.status();

  // Eight threads read the trace at once, each first through a different accessor.
  constexpr int kThreads = 8;
  std::vector<const std::vector<Op>*> seen_ops(kThreads, nullptr);
  std::vector<const Op*> seen_relu(kThreads, nullptr);
  std::vector<const Buffer*> seen_calls(kThreads, nullptr);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      switch (t % 4) {
        case 0:
          seen_ops[t] = &trace->ops();
          break;
        case 1:
          seen_calls[t] = &trace->buffers().at("calls");
          break;
        case 2:
          (void)trace->partial_reason();
          break;
        case 3:
          (void)trace->IndexOfLabel("relu_1_4:1");
          break;
      }
      absl::StatusOr<const Op*> relu = trace->Find("relu_1_4:1");
      if (relu.ok()) seen_relu[t] = *relu;
      if (seen_ops[t] == nullptr) seen_ops[t] = &trace->ops();
      if (seen_calls[t] == nullptr) seen_calls[t] = &trace->buffers().at("calls");
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(seen_ops[t], &trace->ops()) << "thread " << t;
    EXPECT_EQ(seen_calls[t], &trace->buffers().at("calls")) << "thread " << t;
    ASSERT_NE(seen_relu[t], nullptr) << "thread " << t;
    EXPECT_EQ(seen_relu[t], &Get(*trace, "relu_1_4:1")) << "thread " << t;
  }
  EXPECT_EQ(ComputeLabels(*trace), kComputeLabels);
  EXPECT_THAT(Get(*trace, "relu_1_4:1").parents, ElementsAre("addmm_1_3:1"));
  EXPECT_THAT(Get(*trace, "relu_1_4:1").children, ElementsAre("addmm_2_6:1"));
  const torch::Tensor hidden = torch::relu(x.matmul(net->fc1->weight.t()) + net->fc1->bias);
  EXPECT_TRUE(torch::allclose(Get(*trace, "relu_1_4:1").out, hidden));
}

TEST(DeferredGraphTest, GraphBuiltAfterTheModelRanAgainAndWasDestroyed) {
  torch::manual_seed(0);
  auto net = std::make_unique<CounterNet>();
  const torch::Tensor x = torch::randn({2, 4});
  const torch::Tensor w1 = (*net)->fc1->weight.clone(), b1 = (*net)->fc1->bias.clone();
  const torch::Tensor w2 = (*net)->fc2->weight.clone(), b2 = (*net)->fc2->bias.clone();
  absl::StatusOr<Trace> trace = Capture(*net, x);
  ASSERT_TRUE(trace.ok()) << trace.status();

  // The model runs again (its counter goes to 2) and is destroyed before the graph is read.
  (void)(*net)->forward(x);
  EXPECT_EQ((*net)->calls.item<float>(), 2.0f);
  net.reset();

  EXPECT_EQ(ComputeLabels(*trace), kComputeLabels);
  const Buffer& calls = trace->buffers().at("calls");
  ASSERT_EQ(calls.versions.size(), 2u);
  EXPECT_EQ(calls.num_overwrites, 1);
  EXPECT_EQ(calls.initial_value.item<float>(), 0.0f);
  EXPECT_EQ(calls.value_at(1)->item<float>(), 0.0f);
  EXPECT_EQ(calls.value_after(1)->item<float>(), 1.0f);
  EXPECT_EQ(calls.final_value.item<float>(), 1.0f);
  const torch::Tensor out = torch::relu(x.matmul(w1.t()) + b1).matmul(w2.t()) + b2;
  EXPECT_TRUE(torch::allclose(Get(*trace, "addmm_2_6:1").out, out));
  EXPECT_TRUE(torch::allclose(Get(*trace, "output_1").out, out));
}

TEST(DeferredGraphTest, CopiesAndMovesOfAPendingTraceHoldTheSameGraph) {
  torch::manual_seed(0);
  CounterNet net;
  const torch::Tensor x = torch::randn({2, 4});
  absl::StatusOr<Trace> first = Capture(net, x);
  absl::StatusOr<Trace> second = Capture(net, x);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();

  const Trace copy = *first;  // builds the original's graph, then copies it
  Trace moved = *std::move(second);
  EXPECT_EQ(Labels(copy), Labels(*first));
  EXPECT_EQ(Labels(moved), Labels(*first));
  EXPECT_EQ(ComputeLabels(moved), kComputeLabels);
  // Each holds its own projections, pointing into its own ops.
  const Op* copied_version = copy.buffers().at("calls").versions.front();
  EXPECT_GE(copy.IndexOf(copied_version), 0);
  EXPECT_EQ(copy.IndexOf(copied_version), copy.IndexOfLabel(copied_version->label));
  EXPECT_EQ(first->IndexOf(copied_version), -1);
  // The second capture saw the counter at 1 and wrote 2.
  EXPECT_EQ(moved.buffers().at("calls").value_at(1)->item<float>(), 1.0f);
  EXPECT_EQ(moved.buffers().at("calls").final_value.item<float>(), 2.0f);
}

TEST(DeferredGraphTest, AnUnreadTraceKeepsNoParameterAlive) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(0);
  auto net = std::make_unique<CounterNet>();
  const torch::Tensor x = torch::randn({2, 4});
  const c10::weak_intrusive_ptr<c10::TensorImpl> weight((*net)->fc1->weight.getIntrusivePtr());
  CaptureOptions unsaved;
  unsaved.save_activations = false;
  absl::StatusOr<Trace> trace;
  {
    CaptureGuard guard(**net, unsaved);
    guard.MarkInputs(x);
    trace = guard.Finish((*net)->forward(x));
  }
  ASSERT_TRUE(trace.ok()) << trace.status();
  net.reset();
  // Nothing the capture keeps until its graph is built holds the model's parameters.
  EXPECT_TRUE(weight.expired());
  EXPECT_EQ(ComputeLabels(*trace), kComputeLabels);
  EXPECT_EQ(Get(*trace, "addmm_1_3:1").parent_params,
            (absl::InlinedVector<std::string, 2>{"fc1.bias"}));
}

TEST(DeferredGraphTest, ReadingATraceDuringAnotherCaptureRecordsNothing) {
  torch::manual_seed(0);
  CounterNet net;
  const torch::Tensor x = torch::randn({2, 4});
  absl::StatusOr<Trace> earlier = Capture(net, x);
  ASSERT_TRUE(earlier.ok()) << earlier.status();

  CaptureGuard guard(*net);
  guard.MarkInputs(x);
  const torch::Tensor out = net->forward(x);
  // The earlier trace's graph is built while this capture is active.
  EXPECT_EQ(ComputeLabels(*earlier), kComputeLabels);
  absl::StatusOr<Trace> later = guard.Finish(out);
  ASSERT_TRUE(later.ok()) << later.status();
  EXPECT_EQ(ComputeLabels(*later), kComputeLabels);
  EXPECT_EQ(later->capture_stats().user_ops, 6);
}

}  // namespace
}  // namespace torchlens
