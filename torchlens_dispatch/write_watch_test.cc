// Nested calls that write a buffer without the user-level op declaring it (NOTE [Watching
// nested writes]), through the write watch and through the capture key. Expected values
// are hand arithmetic: the op halves its state argument and returns x + state.
#include "torchlens_dispatch/write_watch.h"

#include <ATen/ATen.h>
#include <torch/library.h>
#include <torch/torch.h>

#include <string>
#include <utility>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "torchlens_dispatch/capture.h"
#include "torchlens_dispatch/testing.h"

namespace torchlens {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Writes `state` through a nested, dispatched `mul_` its schema does not declare, as
// batch_norm writes its running statistics.
at::Tensor ScaleState(const at::Tensor& x, const at::Tensor& state) {
  state.mul_(0.5);
  return x + state;
}

torch::Library DefineScaleState() {
  torch::Library library(torch::Library::DEF, "torchlens_watch_test", c10::nullopt, __FILE__,
                         __LINE__);
  library.def("scale_state(Tensor x, Tensor state) -> Tensor");
  return library;
}

torch::Library ImplementScaleState() {
  torch::Library library(torch::Library::IMPL, "torchlens_watch_test", c10::DispatchKey::CPU,
                         __FILE__, __LINE__);
  library.impl("scale_state", &ScaleState);
  return library;
}

// Registered when first asked for, after torchlens loaded: a late operator.
c10::OperatorHandle ScaleStateOp() {
  static const torch::Library def = DefineScaleState();
  static const torch::Library impl = ImplementScaleState();
  return c10::Dispatcher::singleton().findSchemaOrThrow("torchlens_watch_test::scale_state", "");
}

struct StatefulImpl : torch::nn::Module {
  StatefulImpl() { state = register_buffer("state", torch::ones({2})); }
  torch::Tensor forward(const torch::Tensor& x) {
    return ScaleStateOp().typed<at::Tensor(const at::Tensor&, const at::Tensor&)>().call(x, state);
  }
  torch::Tensor state;
};
TORCH_MODULE(Stateful);

// Returns the number of nested calls that declared a write.
int64_t ExpectHalvedState() {
  Stateful model;
  const torch::Tensor x = torch::tensor({1.0f, 2.0f});
  CaptureGuard guard(*model);
  const torch::Tensor out = model->forward(x);
  absl::StatusOr<Trace> trace = guard.Finish(out);
  EXPECT_TRUE(trace.ok()) << trace.status();
  if (!trace.ok()) return -1;
  EXPECT_TRUE(torch::equal(out, torch::tensor({1.5f, 2.5f})));
  const Buffer& state = trace->buffers().at("state");
  EXPECT_EQ(state.num_overwrites, 1);
  EXPECT_EQ(state.versions.size(), 2u);  // the read, then the nested write
  if (state.versions.size() != 2u) return -1;
  EXPECT_EQ(state.versions[1]->buffer_write_kind, WriteKind::kFused);
  EXPECT_EQ(state.versions[1]->buffer_value_changed, true);
  EXPECT_THAT(state.versions[1]->parents, ElementsAre(HasSubstr("scale_state")));
  EXPECT_TRUE(torch::equal(state.final_value, torch::tensor({0.5f, 0.5f})));
  EXPECT_TRUE(torch::equal(state.initial_value, torch::tensor({1.0f, 1.0f})));
  return trace->capture_stats().nested_ops;
}

TEST(WriteWatchTest, UndeclaredNestedWriteIsJournaledByEitherKey) {
  const c10::OperatorHandle op = ScaleStateOp();
  // Registered after the watch: its kernels might call operators the watch does not
  // cover, so its nested calls go through the capture key.
  ASSERT_FALSE(WriteWatchCovers(op));
  const int64_t seen_by_capture_key = ExpectHalvedState();
  WatchNestedCallsOfForTesting(op.operator_name());
  ASSERT_TRUE(WriteWatchCovers(op));
  const int64_t seen_by_watch = ExpectHalvedState();
  // mul_ (Scalar), and the calls it makes that declare a write (mul_ on the scalar
  // wrapped in a tensor, and that tensor's fill_): the same calls through either key.
  EXPECT_GE(seen_by_capture_key, 1);
  EXPECT_EQ(seen_by_watch, seen_by_capture_key);
}

TEST(WriteWatchTest, OperatorsOfLibTorchAreCovered) {
  for (const auto& [name, overload] : {std::pair<const char*, const char*>{"aten::linear", ""},
                                       {"aten::batch_norm", ""},
                                       {"aten::add_", "Tensor"}}) {
    const c10::optional<c10::OperatorHandle> op =
        c10::Dispatcher::singleton().findOp(c10::OperatorName(name, overload));
    ASSERT_TRUE(op.has_value()) << name;
    EXPECT_TRUE(WriteWatchCovers(*op)) << name;
  }
}

}  // namespace
}  // namespace torchlens
