// CaptureOptions::value_sink (NOTE [Streaming saved values] in capture_options.h): each
// saved node value reaches the sink once, as the trace holds it, with eager PyTorch's
// values; a failing sink leaves the forward undisturbed.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/script.h>

#include <map>
#include <stdexcept>
#include <utility>

#include "testdata/testdata.h"
#include "torchlens_dispatch/capture.h"

namespace torchlens {
namespace {

using ::testing::HasSubstr;

// What a sink received: (node, output) -> a copy of the value.
using Received = std::map<std::pair<int32_t, int>, at::Tensor>;

CaptureOptions Collecting(Received* received) {
  CaptureOptions options;
  options.value_sink = [received](const StreamedValue& v) {
    const bool first = received->emplace(std::make_pair(v.node, v.output), v.value.clone()).second;
    if (!first) throw std::logic_error("a value was streamed twice");
  };
  return options;
}

// Every saved node value except output nodes' was streamed, bit-identical to the trace's.
void ExpectStreamedAsSaved(const Trace& trace, const Received& received) {
  size_t expected = 0;
  for (size_t i = 0; i < trace.ops().size(); ++i) {
    const Op& op = trace.ops()[i];
    if (op.is_output()) continue;
    const int outputs = op.outs.empty() ? 1 : static_cast<int>(op.outs.size());
    for (int k = -static_cast<int>(op.alias_writes.size()); k < outputs; ++k) {
      const at::Tensor& saved = OutputValue(op, k);
      if (!saved.defined()) continue;
      ++expected;
      auto it = received.find({static_cast<int32_t>(i), k});
      ASSERT_NE(it, received.end()) << op.label << " output " << k << " was not streamed";
      EXPECT_TRUE(at::equal(it->second, saved)) << op.label << " output " << k;
    }
  }
  EXPECT_EQ(received.size(), expected);
}

TEST(StreamingTest, EveryValueOnceAsTheTraceHoldsIt) {
  // index_writes: TorchScript's torch.tensor([...]) is `empty` filled without dispatch
  // (NOTE [Streaming memory written without dispatch]).
  for (const char* name : {"mlp", "bn2d_train", "counter_cell", "view_write", "index_writes"}) {
    SCOPED_TRACE(name);
    torch::jit::Module model = testdata::LoadModel(name);
    testdata::Expected expected(name);
    Received received;
    absl::StatusOr<Trace> trace = TraceModule(model, expected.inputs(), Collecting(&received));
    ASSERT_TRUE(trace.ok()) << trace.status();
    ExpectStreamedAsSaved(*trace, received);
    // The last streamed op value is the model's output, as eager PyTorch computed it.
    const Op& output = trace->ops().back();
    ASSERT_TRUE(output.is_output());
    const int producer = output.parent_indices.at(0);
    const int which = output.arg_sources.empty() ? 0 : output.arg_sources[0].output_index;
    EXPECT_TRUE(at::allclose(received.at({producer, which}), expected.output(0), 1e-5, 1e-6));
  }
}

// y = relu(x); z = y + 1; y.mul_(3): relu's value is streamed before mul_ writes it, and
// is what the trace keeps (copy-on-write), not what y holds at the end.
TEST(StreamingTest, AValueWrittenLaterIsStreamedAsItWas) {
  torch::jit::Module model = testdata::LoadModel("inplace_after_read");
  testdata::Expected expected("inplace_after_read");
  Received received;
  absl::StatusOr<Trace> trace = TraceModule(model, expected.inputs(), Collecting(&received));
  ASSERT_TRUE(trace.ok()) << trace.status();
  ExpectStreamedAsSaved(*trace, received);
  for (size_t i = 0; i < trace->ops().size(); ++i) {
    if (trace->ops()[i].type != "relu") continue;
    EXPECT_TRUE(at::equal(received.at({static_cast<int32_t>(i), 0}), at::relu(expected.input(0))));
  }
}

// NOTE [Streaming without saving]: the same values reach the sink, and the trace keeps
// none of them (only the replay data).
TEST(StreamingTest, WithoutSavingEveryValueStillArrives) {
  for (const char* name :
       {"mlp", "bn2d_train", "counter_cell", "view_write", "inplace_after_read",
        "view_of_view_write", "slice_assign", "pad_through_view", "transposed_write",
        "dropout_train", "recurrent_loop", "index_writes", "param_view_writes"}) {
    SCOPED_TRACE(name);
    testdata::Expected expected(name);
    torch::jit::Module saved_model = testdata::LoadModel(name);
    at::manual_seed(7);
    absl::StatusOr<Trace> saved = TraceModule(saved_model, expected.inputs());
    ASSERT_TRUE(saved.ok()) << saved.status();

    torch::jit::Module model = testdata::LoadModel(name);
    Received received;
    CaptureOptions options = Collecting(&received);
    options.save_activations = false;
    at::manual_seed(7);
    absl::StatusOr<Trace> streamed = TraceModule(model, expected.inputs(), options);
    ASSERT_TRUE(streamed.ok()) << streamed.status();
    ASSERT_EQ(streamed->ops().size(), saved->ops().size());
    ExpectStreamedAsSaved(*saved, received);
    EXPECT_FALSE(streamed->has_saved_values());
    for (size_t i = 0; i < saved->ops().size(); ++i) {
      const Op& op = streamed->ops()[i];
      EXPECT_EQ(op.label, saved->ops()[i].label);
      EXPECT_FALSE(op.out.defined()) << op.label;
      // Replay data is kept: an argument a node produced is named by its source only.
      EXPECT_EQ(op.arg_sources.size(), saved->ops()[i].arg_sources.size()) << op.label;
      EXPECT_EQ(op.creation_args.size(), saved->ops()[i].creation_args.size()) << op.label;
      EXPECT_EQ(op.rng_state.defined(), saved->ops()[i].rng_state.defined()) << op.label;
    }
  }
}

TEST(StreamingTest, SelectiveSavingStreamsTheSelectedOpsOnly) {
  torch::jit::Module model = testdata::LoadModel("demo");
  testdata::Expected expected("demo");
  Received received;
  CaptureOptions options = Collecting(&received);
  options.save_types = {"relu"};
  absl::StatusOr<Trace> trace = TraceModule(model, expected.inputs(), options);
  ASSERT_TRUE(trace.ok()) << trace.status();
  ExpectStreamedAsSaved(*trace, received);
  int relus = 0;
  for (const auto& [key, value] : received) {
    const Op& op = trace->ops()[key.first];
    EXPECT_TRUE(!op.is_compute() || op.type == "relu") << op.label;
    relus += op.type == "relu";
  }
  EXPECT_EQ(relus, 2);  // block1's and block2's
}

TEST(StreamingTest, AThrowingSinkAbortsTheCaptureNotTheForward) {
  torch::jit::Module model = testdata::LoadModel("bn2d_train");
  testdata::Expected expected("bn2d_train");
  int calls = 0;
  CaptureOptions options;
  options.value_sink = [&calls](const StreamedValue&) {
    if (++calls == 3) throw std::runtime_error("disk full");
  };
  CaptureGuard guard(model, options);
  const c10::IValue y = model.forward(expected.inputs());
  absl::StatusOr<Trace> trace = guard.Finish(y);
  EXPECT_EQ(trace.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(trace.status().message()), HasSubstr("value_sink threw"));
  EXPECT_THAT(std::string(trace.status().message()), HasSubstr("disk full"));
  EXPECT_EQ(calls, 3);  // the third value threw: no more calls
  // The forward was not disturbed: eager PyTorch's output and running statistics.
  EXPECT_TRUE(at::allclose(y.toTensor(), expected.output(0), 1e-5, 1e-6));
  const at::Tensor mean = model.attr("bn").toModule().attr("running_mean").toTensor();
  EXPECT_TRUE(at::allclose(mean, expected.buffer("bn.running_mean"), 1e-5, 1e-6));
}

}  // namespace
}  // namespace torchlens
