// torch::nn (C++ frontend) modules that keep state in buffers, each captured and checked
// against an uncaptured twin built from the same seed (the oracle is eager LibTorch): the
// forward's output and every buffer's final value (in the trace and in the live model), a
// passing ValidateForwardPass, and a Do edit of the input against the twin run on the
// edited input, with no warning. The modules write their state the ways C++ code does:
// through transposed, diagonal and narrowed views, index_put_ with accumulation, copy_ of a
// recurrent cell's result, a fused BatchNorm/InstanceNorm update followed by a write
// through a view of the running mean, an LSTM's state copied back, Embedding's max_norm
// renormalising its weight in place, and a running average next to dropout in training.
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <tuple>

#include "gtest/gtest.h"
#include "torchlens_dispatch/capture.h"
#include "validation/intervene.h"
#include "validation/validate.h"

namespace torchlens {
namespace {

using Forward = std::function<torch::Tensor(torch::nn::Module&, const torch::Tensor&)>;
using Factory = std::function<std::shared_ptr<torch::nn::Module>()>;

// Captures `forward` on a model from `make` and compares it with twins from the same seed.
void ExpectMatchesTwin(Factory make, Forward forward, const torch::Tensor& x, bool train) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(1);
  auto model = make();
  torch::manual_seed(1);
  auto twin = make();
  torch::manual_seed(1);
  auto edited_twin = make();
  model->train(train);
  twin->train(train);
  edited_twin->train(train);
  torch::manual_seed(7);  // dropout draws the same mask in the capture and the twin
  torch::Tensor out;
  absl::StatusOr<Trace> trace;
  {
    CaptureGuard guard(*model);
    out = forward(*model, x);
    trace = guard.Finish(out);
  }
  ASSERT_TRUE(trace.ok()) << trace.status();
  torch::manual_seed(7);
  torch::Tensor expected = forward(*twin, x);
  EXPECT_TRUE(torch::allclose(out, expected)) << out << expected;
  for (const auto& item : twin->named_buffers()) {
    auto it = trace->buffers().find(item.key());
    if (it == trace->buffers().end()) {
      ADD_FAILURE() << "no buffer " << item.key();
      continue;
    }
    EXPECT_TRUE(it->second.final_value.defined() &&
                it->second.final_value.sizes() == item.value().sizes() &&
                torch::allclose(it->second.final_value, item.value()))
        << item.key() << " final " << it->second.final_value << " eager " << item.value();
    auto live = model->named_buffers()[item.key()];
    EXPECT_TRUE(torch::allclose(live, item.value())) << "live " << item.key();
  }
  absl::StatusOr<ValidationReport> report = ValidateForwardPass(*trace);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->passed);
  for (const auto& f : report->failures) ADD_FAILURE() << f;
  // Do: the input set to 0.5 everywhere, against the twin run on that input.
  torch::Tensor edited_input = torch::full_like(x, 0.5);
  absl::StatusOr<DoResult> done = Do(*trace, {Edit{"input_1", edited_input}});
  ASSERT_TRUE(done.ok()) << done.status();
  for (const auto& w : done->warnings) ADD_FAILURE() << "warning " << w.message;
  torch::manual_seed(7);
  torch::Tensor edited_expected = forward(*edited_twin, edited_input);
  auto edited = done->trace.Find("output_1");
  ASSERT_TRUE(edited.ok());
  EXPECT_TRUE(torch::allclose((*edited)->out, edited_expected, 1e-4, 1e-5))
      << (*edited)->out << edited_expected;
  for (const auto& item : edited_twin->named_buffers()) {
    auto it = done->trace.buffers().find(item.key());
    if (it == done->trace.buffers().end()) {
      ADD_FAILURE() << "no buffer " << item.key() << " in the fork";
      continue;
    }
    EXPECT_TRUE(torch::allclose(it->second.final_value, item.value(), 1e-4, 1e-5))
        << "edited final " << item.key() << it->second.final_value << item.value();
  }
}

struct ViewsImpl : torch::nn::Module {
  ViewsImpl() { b = register_buffer("b", torch::arange(16.).reshape({4, 4})); }
  torch::Tensor forward(const torch::Tensor& x) {
    b.t()[0].add_(x);
    b.diagonal().copy_(x * 2);
    auto r = b.narrow(1, 1, 2).sum();
    b.index_put_({torch::tensor({0, 0, 3})}, torch::ones({3, 4}), /*accumulate=*/true);
    return b.sum(0) + r;
  }
  torch::Tensor b;
};

struct StateImpl : torch::nn::Module {
  StateImpl() {
    cell = register_module("cell", torch::nn::GRUCell(4, 4));
    h = register_buffer("h", torch::zeros({1, 4}));
    count = register_buffer("count", torch::zeros({}, torch::kLong));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    for (int i = 0; i < 3; ++i) {
      h.copy_(cell(x, h));
      count.add_(1);
    }
    return h * 1.0;
  }
  torch::nn::GRUCell cell{nullptr};
  torch::Tensor h, count;
};

struct NormsImpl : torch::nn::Module {
  NormsImpl() {
    bn = register_module("bn", torch::nn::BatchNorm1d(4));
    in = register_module("in", torch::nn::InstanceNorm1d(
                                   torch::nn::InstanceNorm1dOptions(4).track_running_stats(true)));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto y = bn(x);
    auto z = in(y.unsqueeze(0).transpose(1, 2)).transpose(1, 2).squeeze(0);
    bn->running_mean.narrow(0, 0, 2).mul_(0.5);
    return z + bn->running_mean;
  }
  torch::nn::BatchNorm1d bn{nullptr};
  torch::nn::InstanceNorm1d in{nullptr};
};

struct LstmImpl : torch::nn::Module {
  LstmImpl() {
    lstm = register_module("lstm", torch::nn::LSTM(torch::nn::LSTMOptions(4, 4).num_layers(2)));
    h = register_buffer("h", torch::zeros({2, 1, 4}));
    c = register_buffer("c", torch::zeros({2, 1, 4}));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto r = lstm(x.unsqueeze(1), std::make_tuple(h, c));
    auto state = std::get<1>(r);
    h.copy_(std::get<0>(state));
    c.copy_(std::get<1>(state));
    return std::get<0>(r).squeeze(1);
  }
  torch::nn::LSTM lstm{nullptr};
  torch::Tensor h, c;
};

struct EmbedImpl : torch::nn::Module {
  EmbedImpl() {
    emb = register_module("emb",
                          torch::nn::Embedding(torch::nn::EmbeddingOptions(6, 4).max_norm(1.0)));
    mask = register_buffer("mask", torch::zeros({4}, torch::kBool));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto idx = (x.abs() * 3).to(torch::kLong).clamp(0, 5);
    auto e = emb(idx);
    mask.logical_or_(e.sum(0) > 0);
    return e.sum(0) * mask;
  }
  torch::nn::Embedding emb{nullptr};
  torch::Tensor mask;
};

struct DropImpl : torch::nn::Module {
  DropImpl() {
    fc = register_module("fc", torch::nn::Linear(4, 4));
    drop = register_module("drop", torch::nn::Dropout(0.5));
    avg = register_buffer("avg", torch::zeros({4}));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto y = drop(torch::relu(fc(x)));
    avg.mul_(0.9).add_(y.mean(0), 0.1);
    y.select(0, 0).zero_();
    return y + avg;
  }
  torch::nn::Linear fc{nullptr};
  torch::nn::Dropout drop{nullptr};
  torch::Tensor avg;
};

template <typename M>
Factory Make() {
  return [] { return std::make_shared<M>(); };
}
template <typename M>
Forward Call() {
  return [](torch::nn::Module& m, const torch::Tensor& x) { return static_cast<M&>(m).forward(x); };
}

TEST(NnModulesTest, Views) {
  ExpectMatchesTwin(Make<ViewsImpl>(), Call<ViewsImpl>(), torch::randn({4}), false);
}
TEST(NnModulesTest, State) {
  ExpectMatchesTwin(Make<StateImpl>(), Call<StateImpl>(), torch::randn({1, 4}), false);
}
TEST(NnModulesTest, NormsTrain) {
  ExpectMatchesTwin(Make<NormsImpl>(), Call<NormsImpl>(), torch::randn({5, 4}), true);
}
TEST(NnModulesTest, NormsEval) {
  ExpectMatchesTwin(Make<NormsImpl>(), Call<NormsImpl>(), torch::randn({5, 4}), false);
}
TEST(NnModulesTest, Lstm) {
  ExpectMatchesTwin(Make<LstmImpl>(), Call<LstmImpl>(), torch::randn({3, 4}), false);
}
TEST(NnModulesTest, Embed) {
  ExpectMatchesTwin(Make<EmbedImpl>(), Call<EmbedImpl>(), torch::randn({3}), false);
}
TEST(NnModulesTest, DropTrain) {
  ExpectMatchesTwin(Make<DropImpl>(), Call<DropImpl>(), torch::randn({3, 4}), true);
}

}  // namespace
}  // namespace torchlens
