// Capture of torch::nn (C++ frontend) modules: addressing, ownership-based module
// attribution, passes of a re-called submodule, and buffer writes (in-place, fused, and
// unjournaled). Expected running statistics are computed by hand from the saved values.
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/torch.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testdata/trace_testing.h"
#include "torchlens_dispatch/capture.h"
#include "torchlens_dispatch/ops/capture_key.h"
#include "validation/validate.h"

namespace torchlens {
namespace {

using ::torchlens::testing_util::Get;
using ::torchlens::testing_util::Labels;

using ::testing::ElementsAre;
using ::testing::HasSubstr;

struct NetImpl : torch::nn::Module {
  NetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(4, 3));
    bn = register_module("bn", torch::nn::BatchNorm1d(3));
    fc2 = register_module("fc2", torch::nn::Linear(3, 2));
    steps = register_buffer("steps", torch::zeros({1}));
    window = register_buffer("window", torch::zeros({4}));
  }
  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor h = torch::relu(bn(fc1(x)));
    steps.add_(1.0);
    window.slice(0, 0, 2).copy_(h.sum(1));
    return fc2(h);
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
  torch::Tensor steps, window;
};
TORCH_MODULE(Net);

TEST(NnCaptureTest, GraphModulesAndBuffers) {
  torch::manual_seed(0);
  Net net;
  torch::manual_seed(0);
  Net plain;
  const torch::Tensor x = torch::randn({2, 4});

  CaptureGuard guard(*net);
  const torch::Tensor out = net->forward(x);
  absl::StatusOr<Trace> trace = guard.Finish(out);
  ASSERT_TRUE(trace.ok()) << trace.status();

  // Bit-identical to an uncaptured twin.
  EXPECT_TRUE(torch::equal(out, plain->forward(x)));
  EXPECT_TRUE(torch::equal(net->bn->running_mean, plain->bn->running_mean));
  EXPECT_TRUE(torch::equal(net->window, plain->window));

  std::vector<std::string> compute;
  std::vector<std::string> modules;
  for (const Op& op : trace->ops()) {
    if (!op.is_compute()) continue;
    compute.push_back(op.label);
    modules.push_back(op.module_address);
  }
  // The C++ frontend's Linear runs t + addmm on 2-d inputs.
  EXPECT_THAT(compute, ElementsAre("t_1_1:1", "addmm_1_2:1", "add__1_3:1", "batch_norm_1_4:1",
                                   "relu_1_5:1", "add__2_6:1", "slice_1_7:1", "sum_1_8:1",
                                   "copy__1_9:1", "t_2_10:1", "addmm_2_11:1"));
  // Attribution by ownership: an op belongs to the module owning a parameter or buffer it
  // reads; others to the root.
  EXPECT_THAT(modules, ElementsAre("fc1", "fc1", "bn", "bn", "", "", "", "", "", "fc2", "fc2"));

  EXPECT_EQ(trace->modules().at("bn").type_name, "BatchNorm1d");
  EXPECT_EQ(trace->modules().at("fc1").type_name, "Linear");
  EXPECT_EQ(trace->modules().at("").type_name, "Net");
  EXPECT_THAT(trace->modules().at("bn").buffers,
              ElementsAre("bn.running_mean", "bn.running_var", "bn.num_batches_tracked"));
  EXPECT_THAT(trace->params().at("fc1.weight").shape, ElementsAre(3, 4));

  // BatchNorm1d in training mode: three buffers, one write each.
  const torch::Tensor h = Get(*trace, "addmm_1_2:1").out;
  const torch::Tensor mean = h.mean(0);
  const torch::Tensor var = h.var(0, /*unbiased=*/true);
  const Buffer& running_mean = trace->buffers().at("bn.running_mean");
  const Buffer& running_var = trace->buffers().at("bn.running_var");
  const Buffer& count = trace->buffers().at("bn.num_batches_tracked");
  EXPECT_EQ(running_mean.num_overwrites, 1);
  EXPECT_EQ(running_var.num_overwrites, 1);
  EXPECT_EQ(count.num_overwrites, 1);
  EXPECT_EQ(running_mean.versions.back()->buffer_write_kind, WriteKind::kFused);
  EXPECT_EQ(running_mean.versions.back()->buffer_value_changed, true);
  EXPECT_TRUE(torch::allclose(running_mean.final_value, 0.1 * mean, 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(running_var.final_value, 0.9 + 0.1 * var, 1e-5, 1e-6));
  EXPECT_EQ(count.versions.back()->buffer_write_kind, WriteKind::kInplace);
  EXPECT_EQ(count.final_value.item<int64_t>(), 1);

  // In-place writes to the model's own buffers, directly and through a slice.
  const Buffer& steps = trace->buffers().at("steps");
  EXPECT_EQ(steps.num_overwrites, 1);
  EXPECT_EQ(steps.final_value.item<float>(), 1.0f);
  const Buffer& window = trace->buffers().at("window");
  EXPECT_EQ(window.num_overwrites, 1);
  const torch::Tensor sums = Get(*trace, "relu_1_5:1").out.sum(1);
  EXPECT_TRUE(torch::allclose(window.final_value.slice(0, 0, 2), sums));
  EXPECT_TRUE(torch::equal(window.final_value.slice(0, 2, 4), torch::zeros({2})));
  EXPECT_THAT(Get(*trace, "window:2").parents, ElementsAre("copy__1_9:1"));
  EXPECT_EQ(Get(*trace, "window:1").label, "buffer_5:1");  // fifth buffer to appear
  EXPECT_THAT(Get(*trace, "slice_1_7:1").parents, ElementsAre("buffer_5:1"));
}

struct TwiceImpl : torch::nn::Module {
  TwiceImpl() { fc = register_module("fc", torch::nn::Linear(3, 3)); }
  torch::Tensor forward(torch::Tensor x) { return fc(torch::relu(fc(x))); }
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(Twice);

// One captured forward of a C++ frontend module on `x`.
template <typename Net>
absl::StatusOr<Trace> CaptureForward(Net& net, const torch::Tensor& x) {
  CaptureGuard guard(*net);
  const torch::Tensor out = net->forward(x);
  return guard.Finish(out);
}

TEST(NnCaptureTest, SubmoduleCalledTwiceHasTwoPasses) {
  Twice net;
  absl::StatusOr<Trace> trace = CaptureForward(net, torch::randn({1, 3}));
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_THAT(Labels(*trace), ElementsAre("t_1_1:1", "input_1", "addmm_1_2:1", "relu_1_3:1",
                                          "t_1_1:2", "addmm_1_2:2", "output_1"));
}

struct SetDataImpl : torch::nn::Module {
  SetDataImpl() { mask = register_buffer("mask", torch::ones({3})); }
  torch::Tensor forward(torch::Tensor x) {
    mask.set_data(torch::zeros({3}));  // the C++ form of `self.mask.data = ...`
    return x * mask;
  }
  torch::Tensor mask;
};
TORCH_MODULE(SetData);

TEST(NnCaptureTest, SetDataInForwardIsReported) {
  SetData net;
  {
    CaptureGuard guard(*net);
    const torch::Tensor out = net->forward(torch::ones({3}));
    absl::StatusOr<Trace> trace = guard.Finish(out);
    EXPECT_EQ(trace.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(trace.status().message()), HasSubstr("\"mask\""));
  }
  net->mask.fill_(1.0);
  CaptureOptions allow;
  allow.allow_unjournaled_writes = true;
  CaptureGuard guard(*net, allow);
  const torch::Tensor out = net->forward(torch::ones({3}));
  absl::StatusOr<Trace> trace = guard.Finish(out);
  ASSERT_TRUE(trace.ok()) << trace.status();
  ASSERT_EQ(trace->diagnostics().size(), 1u);
  EXPECT_EQ(trace->diagnostics()[0].address, "mask");
}

// A tensor the capture never saw produced (made with the capture key excluded, as the
// TorchScript interpreter makes some constants) at the address of a freed op output is a
// constant, not that op's output: see NOTE [Address reuse in unsaved mode].
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAllocatorReusesAddresses = false;  // ASan quarantines freed memory
#else
constexpr bool kAllocatorReusesAddresses = true;
#endif

struct AddressReuseImpl : torch::nn::Module {
  torch::Tensor forward(torch::Tensor x) {
    const void* freed = nullptr;
    {
      torch::Tensor doubled = x * 2;  // recorded, then freed
      freed = doubled.unsafeGetTensorImpl();
    }
    torch::Tensor outside;
    {
      c10::impl::ExcludeDispatchKeyGuard unseen(kCaptureKey);
      outside = at::ones({3});
    }
    reused = outside.unsafeGetTensorImpl() == freed;
    return x + outside;
  }
  bool reused = false;
};
TORCH_MODULE(AddressReuse);

TEST(NnCaptureTest, TensorFromOutsideAtAFreedAddressIsAConstant) {
  AddressReuse net;
  // Unsaved (version counters tell tensors apart), unsaved under InferenceMode (tensors
  // have no counter: weak references do), saved (values keep addresses taken), saved
  // selectively (only `add`: the freed `mul` output is not held), and saved with grad (the
  // value saved is a detached alias, another TensorImpl: the capture keeps the freed one's
  // address with a weak reference, as a saved value holding it would).
  struct Case {
    bool save;
    bool inference;
    bool selective;
    bool requires_grad;
  };
  for (const Case& c : {Case{false, false, false, false}, Case{false, true, false, false},
                        Case{true, false, false, false}, Case{true, false, true, false},
                        Case{true, false, false, true}}) {
    SCOPED_TRACE(testing::Message() << "save " << c.save << " inference " << c.inference
                                    << " selective " << c.selective << " grad " << c.requires_grad);
    std::optional<c10::InferenceMode> inference_mode;
    if (c.inference) inference_mode.emplace();
    const torch::Tensor x = torch::tensor({1.0, 2.0, 3.0}).requires_grad_(c.requires_grad);
    CaptureOptions options;
    options.save_activations = c.save;
    if (c.selective) options.save_types = {"add"};
    CaptureGuard guard(*net, options);
    guard.MarkInputs(x);
    const torch::Tensor out = net->forward(x);
    absl::StatusOr<Trace> trace = guard.Finish(out);
    ASSERT_TRUE(trace.ok()) << trace.status();
    const bool held = c.save && !c.selective;
    if (c.inference || c.requires_grad) {
      EXPECT_FALSE(net->reused);  // the weak reference keeps the freed TensorImpl's memory
    } else if (!held && kAllocatorReusesAddresses) {
      ASSERT_TRUE(net->reused) << "the allocator did not reuse the address; test is void";
    }
    // NOTE [Constants]: the tensor from outside has a source node of its own.
    EXPECT_THAT(Get(*trace, "add_1_2:1").parents, ElementsAre("input_1", "constant_1"));
    EXPECT_TRUE(Get(*trace, "constant_1").is_constant());
    EXPECT_THAT(Get(*trace, "mul_1_1:1").children, testing::IsEmpty());
  }
}

// Layers are numbered per type, and the type is the operator's name without its
// overload: aten::add.Tensor and aten::add.Scalar count as the first and second "add".
struct AddsImpl : torch::nn::Module {
  torch::Tensor forward(torch::Tensor x, torch::Tensor y) {
    torch::Tensor sum = x.add(y);        // aten::add.Tensor
    torch::Tensor shifted = sum.add(1);  // aten::add.Scalar
    return torch::relu(shifted).add(y);  // aten::add.Tensor again
  }
};
TORCH_MODULE(Adds);

TEST(NnCaptureTest, OverloadsOfOneOperatorShareTheTypeCount) {
  Adds model;
  const torch::Tensor x = torch::tensor({1.0, -5.0});
  const torch::Tensor y = torch::tensor({2.0, 3.0});
  CaptureGuard guard(*model);
  guard.MarkInputs(c10::ivalue::Tuple::create({x, y}));
  const torch::Tensor out = model->forward(x, y);
  absl::StatusOr<Trace> trace = guard.Finish(out);
  ASSERT_TRUE(trace.ok()) << trace.status();

  EXPECT_THAT(Labels(*trace), ElementsAre("input_1", "input_2", "add_1_1:1", "add_2_2:1",
                                          "relu_1_3:1", "add_3_4:1", "output_1"));
  EXPECT_EQ(Get(*trace, "add_1_1:1").overload_name, "Tensor");
  EXPECT_EQ(Get(*trace, "add_2_2:1").overload_name, "Scalar");
  EXPECT_EQ(Get(*trace, "add_3_4:1").overload_name, "Tensor");
  // (1 + 2) + 1 = 4 -> relu 4 -> 4 + 2 = 6; (-5 + 3) + 1 = -1 -> relu 0 -> 0 + 3 = 3.
  EXPECT_TRUE(torch::equal(out, torch::tensor({6.0, 3.0})));
}

// Saved values the model then overwrites in place keep their value from before the write,
// whether their private copy is streamed (1 MiB and contiguous, aligned or not: NOTE
// [Streaming copies of saved values]) or cloned (the transposed view).
struct OverwritesImpl : torch::nn::Module {
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor doubled = x * 2;
    doubled.relu_();
    torch::Tensor tripled = x * 3;
    torch::Tensor shifted = tripled.view({-1}).slice(0, 1);  // one float into the storage
    tripled.add_(1);
    torch::Tensor swapped = (x * 5).transpose(1, 2);
    swapped.mul_(2);
    return doubled + shifted.sum() + swapped.sum();
  }
};
TORCH_MODULE(Overwrites);

TEST(NnCaptureTest, OverwrittenLargeSavedValuesKeepTheirValueBeforeTheWrite) {
  torch::manual_seed(0);
  Overwrites net;
  const torch::Tensor x = torch::randn({1, 64, 64, 64});  // 1 MiB of floats
  CaptureGuard guard(*net);
  const torch::Tensor out = net->forward(x);
  absl::StatusOr<Trace> trace = guard.Finish(out);
  ASSERT_TRUE(trace.ok()) << trace.status();
  const std::vector<const Op*> muls = testing_util::OpsOfType(*trace, "mul");
  const std::vector<const Op*> views = testing_util::OpsOfType(*trace, "view");
  const std::vector<const Op*> slices = testing_util::OpsOfType(*trace, "slice");
  const std::vector<const Op*> transposes = testing_util::OpsOfType(*trace, "transpose");
  ASSERT_EQ(muls.size(), 3u);
  ASSERT_EQ(views.size(), 1u);
  ASSERT_EQ(slices.size(), 1u);
  ASSERT_EQ(transposes.size(), 1u);
  // Eager values from before each write, computed here without capture.
  EXPECT_TRUE(torch::equal(muls[0]->out, x * 2));
  EXPECT_TRUE(torch::equal(muls[1]->out, x * 3));
  EXPECT_TRUE(torch::equal(views[0]->out, (x * 3).view({-1})));
  EXPECT_TRUE(torch::equal(slices[0]->out, (x * 3).view({-1}).slice(0, 1)));
  EXPECT_TRUE(torch::equal(muls[2]->out, x * 5));
  EXPECT_TRUE(torch::equal(transposes[0]->out, (x * 5).transpose(1, 2)));
  EXPECT_EQ(transposes[0]->out.strides(), (x * 5).transpose(1, 2).strides());
  // relu_ overwrites one saved value, add_ three (product, view, slice), mul_ two.
  EXPECT_EQ(trace->capture_stats().copy_on_write_clones, 6);
  // The model computed what it computes without capture.
  EXPECT_TRUE(torch::equal(out, net->forward(x)));
}

// Values saved in a buffer's or a written parameter's storage are copied at the end of
// the capture (NOTE [Saved values indexed when a write needs them]): the model's writes
// after it must not reach the trace.
struct StateViewsImpl : torch::nn::Module {
  StateViewsImpl() {
    table = register_buffer("table", torch::arange(6.0).reshape({2, 3}));
    scale = register_parameter("scale", torch::full({3}, 2.0));
  }
  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor row = table.select(0, 1);  // a view of the buffer, saved as it is
    torch::Tensor y = x * row;
    {
      torch::NoGradGuard no_grad;
      scale.mul_(0.5);
    }
    torch::Tensor head = scale.narrow(0, 0, 2);  // a view of the written parameter
    return y.narrow(1, 0, 2) + head;
  }
  torch::Tensor table, scale;
};
TORCH_MODULE(StateViews);

TEST(NnCaptureTest, SavedViewsOfModelStateKeepTheirValuesAfterTheCapture) {
  StateViews net;
  absl::StatusOr<Trace> trace = CaptureForward(net, torch::ones({1, 3}));
  ASSERT_TRUE(trace.ok()) << trace.status();
  {
    torch::NoGradGuard no_grad;
    net->table.fill_(-1.0);
    net->scale.fill_(-1.0);
  }
  const std::vector<const Op*> selects = testing_util::OpsOfType(*trace, "select");
  const std::vector<const Op*> narrows = testing_util::OpsOfType(*trace, "narrow");
  ASSERT_EQ(selects.size(), 1u);
  ASSERT_EQ(narrows.size(), 2u);
  // By hand: the table's second row is 3, 4, 5; the scale halved is 1, 1, 1.
  EXPECT_TRUE(torch::equal(selects[0]->out, torch::tensor({3.0f, 4.0f, 5.0f})));
  EXPECT_TRUE(torch::equal(narrows[0]->out, torch::tensor({1.0f, 1.0f})));  // the scale's
  EXPECT_TRUE(torch::equal(Get(*trace, "output_1").out, torch::tensor({{4.0f, 5.0f}})));
  EXPECT_GE(trace->capture_stats().copy_on_write_clones, 2);
}

// NOTE [Parameters read by reference]: a parameter read, then clamped in place by the
// forward, then read again. The first read keeps the value it read, the second reads the
// clamp's output, and neither changes when the model writes the parameter after the
// capture.
struct ClampedWeightImpl : torch::nn::Module {
  ClampedWeightImpl() { w = register_parameter("w", torch::tensor({0.5f, 3.0f})); }
  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor before = x * w;
    {
      torch::NoGradGuard no_grad;
      w.clamp_(c10::nullopt, 1.0);
    }
    torch::Tensor after = x * w;
    return before + after;
  }
  torch::Tensor w;
};
TORCH_MODULE(ClampedWeight);

TEST(NnCaptureTest, ParameterReadThenWrittenInPlaceKeepsEachReadsValue) {
  ClampedWeight net;
  const torch::Tensor x = torch::tensor({2.0f, 2.0f});
  absl::StatusOr<Trace> trace = CaptureForward(net, x);
  ASSERT_TRUE(trace.ok()) << trace.status();
  {
    torch::NoGradGuard no_grad;
    net->w.fill_(7.0);
  }
  const std::vector<const Op*> muls = testing_util::OpsOfType(*trace, "mul");
  ASSERT_EQ(muls.size(), 2u);
  // By hand: [2, 2] * [0.5, 3] = [1, 6]; clamped, w is [0.5, 1], and [1, 2] is added.
  EXPECT_THAT(muls[0]->parent_params, ElementsAre("w"));
  EXPECT_TRUE(torch::equal(muls[0]->creation_args[1].toTensor(), torch::tensor({0.5f, 3.0f})));
  EXPECT_TRUE(torch::equal(muls[0]->out, torch::tensor({1.0f, 6.0f})));
  EXPECT_TRUE(muls[1]->parent_params.empty());  // it reads the clamp's output
  EXPECT_TRUE(torch::equal(muls[1]->creation_args[1].toTensor(), torch::tensor({0.5f, 1.0f})));
  EXPECT_TRUE(torch::equal(Get(*trace, "output_1").out, torch::tensor({2.0f, 8.0f})));
  EXPECT_FALSE(muls[0]->creation_args[1].toTensor().requires_grad());
  absl::StatusOr<ValidationReport> report = ValidateForwardPass(*trace);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->passed) << testing::PrintToString(report->failures);
}

// Two parameters that are views of one storage: the forward writes one, then reads the
// other for the first time. Its value is kept like a written parameter's, so the model's
// write after the capture does not reach the trace (NOTE [Parameters read by reference]).
struct SharedStorageParamsImpl : torch::nn::Module {
  SharedStorageParamsImpl() {
    const torch::Tensor flat = torch::tensor({1.0f, 2.0f, 3.0f, 4.0f});
    a = register_parameter("a", flat.narrow(0, 0, 2));
    b = register_parameter("b", flat.narrow(0, 2, 2));
  }
  torch::Tensor forward(torch::Tensor x) {
    {
      torch::NoGradGuard no_grad;
      b.mul_(2.0);
    }
    torch::Tensor first = x * a;  // one statement each: the order of `+`'s operands is unspecified
    return first + x * b;
  }
  torch::Tensor a, b;
};
TORCH_MODULE(SharedStorageParams);

TEST(NnCaptureTest, ParameterFirstReadAfterItsStorageWasWrittenIsKept) {
  SharedStorageParams net;
  const torch::Tensor x = torch::tensor({1.0f, 10.0f});
  absl::StatusOr<Trace> trace = CaptureForward(net, x);
  ASSERT_TRUE(trace.ok()) << trace.status();
  {
    torch::NoGradGuard no_grad;
    net->a.fill_(-1.0);
    net->b.fill_(-1.0);
  }
  const std::vector<const Op*> muls = testing_util::OpsOfType(*trace, "mul");
  ASSERT_EQ(muls.size(), 2u);
  // By hand: a = [1, 2] and b doubled = [6, 8]: [1, 20] + [6, 80].
  EXPECT_THAT(muls[0]->parent_params, ElementsAre("a"));
  EXPECT_TRUE(torch::equal(muls[0]->creation_args[1].toTensor(), torch::tensor({1.0f, 2.0f})));
  EXPECT_TRUE(torch::equal(muls[1]->creation_args[1].toTensor(), torch::tensor({6.0f, 8.0f})));
  EXPECT_TRUE(torch::equal(Get(*trace, "output_1").out, torch::tensor({7.0f, 100.0f})));
  absl::StatusOr<ValidationReport> report = ValidateForwardPass(*trace);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->passed) << testing::PrintToString(report->failures);
}

// A write through a view of a tensor the capture does not save (a selective capture that
// saves only `add`) is an alias write as in the other modes: the op reading the base
// afterwards hangs off the writer, not off the stale producer (NOTE [Writes through
// views]).
struct WriteThroughViewImpl : torch::nn::Module {
  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor doubled = x * 2;
    doubled.narrow(0, 0, 1).mul_(10);
    return doubled + 1;
  }
};
TORCH_MODULE(WriteThroughView);

TEST(NnCaptureTest, WriteThroughAViewOfAnUnsavedTensorIsAnAliasWrite) {
  WriteThroughView net;
  const torch::Tensor x = torch::tensor({1.0, 2.0, 3.0});
  // Unsaved, saved, selective (only `add` saved), and saved over a budget from the start.
  for (int mode = 0; mode < 4; ++mode) {
    SCOPED_TRACE(testing::Message() << "mode " << mode);
    CaptureOptions options;
    options.save_activations = mode != 0;
    if (mode == 2) options.save_types = {"add"};
    if (mode == 3) {
      options.max_saved_bytes = 0;
      options.partial_on_budget = true;
    }
    CaptureGuard guard(*net, options);
    guard.MarkInputs(x);
    const torch::Tensor out = net->forward(x);
    absl::StatusOr<Trace> trace = guard.Finish(out);
    ASSERT_TRUE(trace.ok()) << trace.status();
    // mul_ wrote `doubled` through the narrow view: add reads the write, not mul's output.
    EXPECT_THAT(Get(*trace, "mul__1_3:1").parents, ElementsAre("narrow_1_2:1", "mul_1_1:1"));
    EXPECT_THAT(Get(*trace, "add_1_4:1").parents, ElementsAre("mul__1_3:1"));
    EXPECT_THAT(Get(*trace, "mul_1_1:1").children, ElementsAre("narrow_1_2:1", "mul__1_3:1"));
    if (mode == 0) continue;
    absl::StatusOr<ValidationReport> report = ValidateForwardPass(*trace);
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_TRUE(report->passed) << testing::PrintToString(report->failures);
    if (mode == 2) {
      // (1, 2, 3) doubled, its first element times 10, plus 1.
      EXPECT_TRUE(torch::equal(Get(*trace, "add_1_4:1").out, torch::tensor({21.0, 5.0, 7.0})));
      EXPECT_FALSE(Get(*trace, "mul_1_1:1").out.defined());
      EXPECT_THAT(report->not_checked, testing::Contains("mul_1_1:1"));
    }
  }
}

}  // namespace
}  // namespace torchlens
