// Registered buffers as versioned state, on TorchScript models. Expected values come from
// eager PyTorch (testdata/*.expected.pt) or hand arithmetic written next to the assertion.
#include <ATen/ATen.h>
#include <torch/script.h>

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testdata/testdata.h"
#include "testdata/trace_testing.h"
#include "torchlens_dispatch/capture.h"

namespace torchlens {
namespace {

using ::torchlens::testing_util::Get;

using ::testing::ElementsAre;
using ::testing::HasSubstr;

absl::StatusOr<Trace> Capture(const std::string& name, CaptureOptions options = {}) {
  torch::jit::Module model = testdata::LoadModel(name);
  return TraceModule(model, testdata::Expected(name).inputs(), options);
}

at::Tensor Values(std::vector<float> values) { return at::tensor(values); }

bool Equal(const at::Tensor& a, const at::Tensor& b) {
  return a.defined() && b.defined() && a.sizes() == b.sizes() && at::allclose(a, b, 1e-6, 1e-7);
}

std::optional<WriteKind> KindOf(const Op* version) { return version->buffer_write_kind; }

// The seed example, exactly as specified.
TEST(BuffersTest, SeedRecurrentReassignment) {
  absl::StatusOr<Trace> trace = Capture("seed_recurrent");
  ASSERT_TRUE(trace.ok()) << trace.status();
  ASSERT_EQ(trace->buffers().count("h"), 1u);
  const Buffer& h = trace->buffers().at("h");
  EXPECT_TRUE(Equal(h.initial_value, at::zeros({2})));
  ASSERT_EQ(h.versions.size(), 3u);
  EXPECT_EQ(h.num_overwrites, 2);
  const float first = std::tanh(1.0f);
  const float second = std::tanh(std::tanh(1.0f) + 1.0f);
  EXPECT_NEAR(second, 0.9426808f, 1e-6);
  EXPECT_TRUE(Equal(h.final_value, Values({second, second})));
  EXPECT_EQ(KindOf(h.versions[0]), std::nullopt);
  EXPECT_EQ(KindOf(h.versions[1]), WriteKind::kReassign);
  EXPECT_EQ(KindOf(h.versions[2]), WriteKind::kReassign);
  EXPECT_TRUE(Equal(*h.value_at(1), at::zeros({2})));
  EXPECT_TRUE(Equal(*h.value_at(2), Values({first, first})));
  EXPECT_TRUE(Equal(*h.value_after(1), Values({first, first})));
  EXPECT_TRUE(Equal(*h.value_after(2), Values({second, second})));

  // Out of range names the valid range.
  EXPECT_EQ(h.value_at(0).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(std::string(h.value_at(4).status().message()), HasSubstr("1..3"));
  EXPECT_EQ(h.value_after(-1).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(std::string(h.value_after(3).status().message()), HasSubstr("1..2"));

  // Graph: producer op -> buffer version -> reader op.
  EXPECT_EQ(Get(*trace, "h:1").label, "buffer_1:1");
  EXPECT_EQ(Get(*trace, "h:2").label, "buffer_1:2");
  EXPECT_EQ(Get(*trace, "buffer_1:3").address, "h");
  EXPECT_EQ(Get(*trace, "buffer_1:3").buffer_pass, 3);
  EXPECT_THAT(Get(*trace, "add_1_1:1").parents, ElementsAre("buffer_1:1", "input_1"));
  EXPECT_THAT(Get(*trace, "buffer_1:2").parents, ElementsAre("tanh_1_2:1"));
  EXPECT_THAT(Get(*trace, "buffer_1:2").children, ElementsAre("add_2_3:1"));
  EXPECT_THAT(Get(*trace, "output_1").parents, ElementsAre("buffer_1:3"));
  EXPECT_EQ(trace->Find("h").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(trace->Find("h:4").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(trace->buffer_read_ops().size(), 1u);
  EXPECT_EQ(trace->buffer_write_ops().size(), 2u);
  EXPECT_THAT(trace->modules().at("").buffers, ElementsAre("h"));
}

TEST(BuffersTest, RecurrentLoopOfFourReassignments) {
  testdata::Expected expected("recurrent_loop");
  torch::jit::Module model = testdata::LoadModel("recurrent_loop");
  const at::Tensor w = model.attr("fc").toModule().attr("weight").toTensor().detach();
  const at::Tensor b = model.attr("fc").toModule().attr("bias").toTensor().detach();
  absl::StatusOr<Trace> trace = TraceModule(model, expected.inputs());
  ASSERT_TRUE(trace.ok()) << trace.status();
  const Buffer& h = trace->buffers().at("h");
  EXPECT_EQ(h.num_overwrites, 4);
  ASSERT_EQ(h.versions.size(), 5u);
  at::Tensor state = at::zeros({3});
  for (int step = 1; step <= 4; ++step) {
    state = at::tanh(at::matmul(w, state) + b + expected.input(0));
    EXPECT_TRUE(at::allclose(*h.value_after(step), state, 1e-5, 1e-6)) << step;
    EXPECT_EQ(h.versions[step]->buffer_write_kind, WriteKind::kReassign);
  }
  EXPECT_TRUE(at::allclose(h.final_value, expected.buffer("h"), 1e-6, 1e-7));
  // The linear of step 2 reads version 2 (written by step 1's tanh).
  EXPECT_THAT(Get(*trace, "linear_1_1:2").parents, ElementsAre("buffer_1:2"));
}

TEST(BuffersTest, MulThenAddInPlace) {
  absl::StatusOr<Trace> trace = Capture("mul_add");
  ASSERT_TRUE(trace.ok()) << trace.status();
  const Buffer& b = trace->buffers().at("b");
  EXPECT_EQ(b.num_overwrites, 2);
  ASSERT_EQ(b.versions.size(), 3u);
  EXPECT_TRUE(Equal(*b.value_at(1), Values({1.0f, 1.0f})));
  EXPECT_TRUE(Equal(*b.value_at(2), Values({2.0f, 2.0f})));
  EXPECT_TRUE(Equal(*b.value_at(3), Values({2.5f, 1.0f})));  // 2 + [0.5, -1]
  EXPECT_EQ(KindOf(b.versions[1]), WriteKind::kInplace);
  EXPECT_EQ(KindOf(b.versions[2]), WriteKind::kInplace);
  EXPECT_THAT(Get(*trace, "mul__1_1:1").parents, ElementsAre("buffer_1:1"));
  EXPECT_THAT(Get(*trace, "buffer_1:2").parents, ElementsAre("mul__1_1:1"));
  EXPECT_THAT(Get(*trace, "add__1_2:1").parents, ElementsAre("buffer_1:2", "input_1"));
  EXPECT_THAT(Get(*trace, "buffer_1:3").parents, ElementsAre("add__1_2:1"));
  EXPECT_TRUE(Equal(b.final_value, testdata::Expected("mul_add").buffer("b")));
}

TEST(BuffersTest, CopyInto) {
  absl::StatusOr<Trace> trace = Capture("copy_into");
  ASSERT_TRUE(trace.ok()) << trace.status();
  const Buffer& b = trace->buffers().at("b");
  EXPECT_EQ(b.num_overwrites, 1);
  EXPECT_TRUE(Equal(*b.value_after(1), Values({1.0f, 2.0f, 3.0f})));
  EXPECT_EQ(KindOf(b.versions.back()), WriteKind::kInplace);
  EXPECT_THAT(Get(*trace, "b:2").parents, ElementsAre("copy__1_1:1"));
}

TEST(BuffersTest, SliceCopyVersionHoldsTheWholeBuffer) {
  absl::StatusOr<Trace> trace = Capture("slice_copy");
  ASSERT_TRUE(trace.ok()) << trace.status();
  const Buffer& b = trace->buffers().at("b");
  EXPECT_EQ(b.num_overwrites, 1);
  EXPECT_TRUE(Equal(*b.value_after(1), Values({1.0f, 1.0f, 0.0f, 0.0f})));
  EXPECT_THAT(Get(*trace, "slice_1_1:1").parents, ElementsAre("buffer_1:1"));
  // The write's earlier state, the buffer's previous version, is a parent too (NOTE
  // [Writes through views]); the version is the copy's first alias write.
  EXPECT_THAT(Get(*trace, "copy__1_2:1").parents,
              ElementsAre("slice_1_1:1", "input_1", "buffer_1:1"));
  EXPECT_THAT(Get(*trace, "b:2").parents, ElementsAre("copy__1_2:1"));
  EXPECT_EQ(Get(*trace, "b:2").arg_sources[0].output_index, -1);
  const AliasWrite& write = Get(*trace, "copy__1_2:1").alias_writes.at(0);
  EXPECT_EQ(write.before.name, "buffer_1:1");
  EXPECT_EQ(write.written_tensor, 0);
  EXPECT_THAT(write.written.sizes, ElementsAre(2));
  EXPECT_THAT(write.aliased.sizes, ElementsAre(4));
  EXPECT_THAT(Get(*trace, "copy__1_2:1").tensor_shape, ElementsAre(2));  // the slice
  EXPECT_THAT(Get(*trace, "b:2").tensor_shape, ElementsAre(4));          // the buffer
}

TEST(BuffersTest, SliceAssignment) {
  absl::StatusOr<Trace> trace = Capture("slice_assign");
  ASSERT_TRUE(trace.ok()) << trace.status();
  const Buffer& b = trace->buffers().at("b");
  EXPECT_EQ(b.num_overwrites, 1);
  EXPECT_TRUE(Equal(b.final_value, Values({5.0f, 6.0f, 0.0f, 0.0f})));
  EXPECT_EQ(KindOf(b.versions.back()), WriteKind::kInplace);
}

TEST(BuffersTest, ReadOnlyBufferHasOneVersion) {
  absl::StatusOr<Trace> trace = Capture("read_only");
  ASSERT_TRUE(trace.ok()) << trace.status();
  const Buffer& b = trace->buffers().at("b");
  EXPECT_EQ(b.num_overwrites, 0);
  ASSERT_EQ(b.versions.size(), 1u);
  EXPECT_EQ(Get(*trace, "b").label, "buffer_1:1");
  EXPECT_FALSE(Get(*trace, "b").buffer_write_kind.has_value());
  EXPECT_TRUE(Equal(b.final_value, Values({1.0f, 2.0f})));
  EXPECT_EQ(b.value_after(1).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_TRUE(Equal(Get(*trace, "output_1").out, Values({11.0f, 22.0f})));
}

TEST(BuffersTest, InplaceResultAndBufferReadTogether) {
  absl::StatusOr<Trace> trace = Capture("add_then_mul");
  ASSERT_TRUE(trace.ok()) << trace.status();
  const Buffer& b = trace->buffers().at("b");
  EXPECT_EQ(b.num_overwrites, 1);
  EXPECT_TRUE(Equal(b.final_value, Values({2.0f, 3.0f})));
  // y = b.add_(x) is b itself: the multiplication reads version 2 for both arguments.
  EXPECT_THAT(Get(*trace, "mul_1_2:1").parents, ElementsAre("buffer_1:2"));
  EXPECT_THAT(Get(*trace, "add__1_1:1").parents, ElementsAre("buffer_1:1", "input_1"));
  EXPECT_TRUE(Equal(Get(*trace, "output_1").out, Values({4.0f, 9.0f})));
}

TEST(BuffersTest, BufferReturnedAsOutput) {
  absl::StatusOr<Trace> trace = Capture("return_buffer");
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_THAT(Get(*trace, "output_1").parents, ElementsAre("buffer_1:1"));
  EXPECT_EQ(trace->buffers().at("b").versions.size(), 1u);
  EXPECT_TRUE(Equal(Get(*trace, "output_1").out, Values({3.0f, 4.0f})));
}

void ExpectTrainingBatchNorm(const std::string& name) {
  SCOPED_TRACE(name);
  testdata::Expected expected(name);
  absl::StatusOr<Trace> trace = Capture(name);
  ASSERT_TRUE(trace.ok()) << trace.status();
  for (const char* stat : {"bn.running_mean", "bn.running_var"}) {
    const Buffer& buffer = trace->buffers().at(stat);
    EXPECT_EQ(buffer.num_overwrites, 1) << stat;
    ASSERT_EQ(buffer.versions.size(), 2u) << stat;
    EXPECT_EQ(buffer.versions[1]->buffer_write_kind, WriteKind::kFused) << stat;
    EXPECT_EQ(buffer.versions[1]->buffer_value_changed, true) << stat;
    EXPECT_THAT(buffer.versions[1]->parents, ElementsAre("batch_norm_1_2:1")) << stat;
    EXPECT_TRUE(at::allclose(buffer.final_value, expected.buffer(stat), 1e-5, 1e-6)) << stat;
    EXPECT_TRUE(at::allclose(buffer.initial_value, expected.initial_buffer(stat))) << stat;
  }
  const Buffer& count = trace->buffers().at("bn.num_batches_tracked");
  EXPECT_EQ(count.num_overwrites, 1);
  EXPECT_EQ(count.versions.back()->buffer_write_kind, WriteKind::kInplace);
  EXPECT_EQ(count.final_value.item<int64_t>(), 1);
  EXPECT_THAT(count.versions.back()->parents, ElementsAre("add__1_1:1"));
  EXPECT_EQ(trace->buffer_write_ops().size(), 3u);
  EXPECT_TRUE(at::allclose(Get(*trace, "output_1").out, expected.output(0), 1e-5, 1e-6));
  EXPECT_GT(trace->capture_stats().nested_ops, 0);  // batch_norm's decomposition was observed
}

TEST(BuffersTest, BatchNorm1dTraining) { ExpectTrainingBatchNorm("bn1d_train"); }

TEST(BuffersTest, BatchNorm2dTraining) { ExpectTrainingBatchNorm("bn2d_train"); }

TEST(BuffersTest, BatchNormEvalReadsRunningStatsWithoutWriting) {
  absl::StatusOr<Trace> trace = Capture("bn2d_eval");
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_TRUE(trace->buffer_write_ops().empty());
  EXPECT_EQ(trace->buffers().at("bn.running_mean").versions.size(), 1u);
  EXPECT_EQ(trace->buffers().at("bn.running_var").versions.size(), 1u);
  EXPECT_TRUE(trace->buffers().at("bn.num_batches_tracked").versions.empty());
  EXPECT_THAT(Get(*trace, "batch_norm_1_1:1").parents,
              ElementsAre("input_1", "buffer_1:1", "buffer_2:1"));
}

TEST(BuffersTest, InstanceNormTrackingRunningStats) {
  testdata::Expected expected("instancenorm_train");
  absl::StatusOr<Trace> trace = Capture("instancenorm_train");
  ASSERT_TRUE(trace.ok()) << trace.status();
  for (const char* stat : {"norm.running_mean", "norm.running_var"}) {
    const Buffer& buffer = trace->buffers().at(stat);
    EXPECT_EQ(buffer.num_overwrites, 1) << stat;
    EXPECT_EQ(buffer.versions.back()->buffer_write_kind, WriteKind::kFused) << stat;
    EXPECT_EQ(buffer.versions.back()->buffer_value_changed, true) << stat;
    EXPECT_TRUE(at::allclose(buffer.final_value, expected.buffer(stat), 1e-5, 1e-6)) << stat;
  }
}

// A ModuleList iterated in a loop: TorchScript cannot name the instances
// from where they are called ("0", "1"); the addresses are resolved through the ModuleList.
TEST(BuffersTest, ModuleListInALoopAttributesEachBatchNorm) {
  absl::StatusOr<Trace> trace = Capture("modulelist_train");
  ASSERT_TRUE(trace.ok()) << trace.status();
  std::vector<std::string> modules;
  for (const Op& op : trace->ops()) {
    if (op.type == "batch_norm" || op.type == "conv2d") modules.push_back(op.module_address);
  }
  EXPECT_THAT(modules, ElementsAre("convs.0.0", "convs.0.1", "convs.1.0", "convs.1.1"));
  for (const char* bn : {"convs.0.1", "convs.1.1"}) {
    for (const char* stat : {"running_mean", "running_var", "num_batches_tracked"}) {
      EXPECT_EQ(trace->buffers().at(absl::StrCat(bn, ".", stat)).num_overwrites, 1) << bn << stat;
    }
  }
}

TEST(BuffersTest, UnusedBuffersCostNothingPerOp) {
  testdata::Expected expected("many_buffers");
  absl::StatusOr<Trace> trace = Capture("many_buffers");
  ASSERT_TRUE(trace.ok()) << trace.status();
  const Buffer& counter = trace->buffers().at("counter");
  EXPECT_EQ(counter.num_overwrites, 8);
  for (int n = 1; n <= 8; ++n) {
    EXPECT_TRUE(Equal(*counter.value_after(n), Values({1.0f * n, 0.5f * n}))) << n;
  }
  EXPECT_EQ(trace->buffers().size(), 49u);
  EXPECT_TRUE(trace->buffers().at("unused_7").versions.empty());
  EXPECT_TRUE(Equal(trace->buffers().at("unused_7").final_value, Values({7.0f, 7.0f})));
  // No code reassigns a buffer, so buffer slots are read once, at the end (49 reads),
  // not once per op per buffer (9 ops x 49 buffers); writes are found by storage lookup.
  EXPECT_EQ(trace->capture_stats().user_ops, 9);
  EXPECT_EQ(trace->capture_stats().buffer_slot_reads, 49);
}

TEST(BuffersTest, SetDataIsAnUnjournaledChange) {
  testdata::Expected expected("read_only");
  for (bool allow : {false, true}) {
    SCOPED_TRACE(allow);
    torch::jit::Module model = testdata::LoadModel("read_only");
    CaptureOptions options;
    options.allow_unjournaled_writes = allow;
    CaptureGuard guard(model, options);
    // The C++ form of `buf.data = t`: same TensorImpl, new storage, no journaled write.
    model.attr("b").toTensor().set_data(at::full({2}, 7.0));
    const c10::IValue out = model.forward(expected.inputs());
    absl::StatusOr<Trace> trace = guard.Finish(out);
    if (!allow) {
      EXPECT_EQ(trace.status().code(), absl::StatusCode::kFailedPrecondition);
      EXPECT_THAT(std::string(trace.status().message()), HasSubstr("\"b\""));
      EXPECT_THAT(std::string(trace.status().message()), HasSubstr("copy_"));
      EXPECT_THAT(std::string(trace.status().message()), HasSubstr("allow_unjournaled_writes"));
    } else {
      ASSERT_TRUE(trace.ok()) << trace.status();
      ASSERT_EQ(trace->diagnostics().size(), 1u);
      EXPECT_EQ(trace->diagnostics()[0].address, "b");
      EXPECT_THAT(trace->diagnostics()[0].message, HasSubstr("set_data"));
    }
  }
}

TEST(BuffersTest, ReassignmentFromCppWithRegisterBuffer) {
  testdata::Expected expected("read_only");
  torch::jit::Module model = testdata::LoadModel("read_only");
  CaptureGuard guard(model);
  model.register_buffer("b", at::full({2}, 3.0));  // replaces the buffer's value
  const c10::IValue out = model.forward(expected.inputs());
  absl::StatusOr<Trace> trace = guard.Finish(out);
  ASSERT_TRUE(trace.ok()) << trace.status();
  const Buffer& b = trace->buffers().at("b");
  EXPECT_EQ(b.num_overwrites, 1);    // exactly once
  ASSERT_EQ(b.versions.size(), 1u);  // the first read already sees the new tensor
  EXPECT_EQ(b.versions[0]->buffer_write_kind, WriteKind::kReassign);
  EXPECT_TRUE(Equal(b.final_value, Values({3.0f, 3.0f})));
  EXPECT_TRUE(Equal(b.initial_value, Values({1.0f, 2.0f})));
  EXPECT_TRUE(Equal(Get(*trace, "output_1").out, Values({13.0f, 23.0f})));
}

// NOTE [Reassigned values by reference]: without saved values, a reassigned state is kept
// by reference with a fingerprint; the results are those of a capture that copies it.
TEST(BuffersTest, UnsavedRecurrentStateEndsWithEagerValue) {
  testdata::Expected expected("recurrent_loop");
  for (bool save : {true, false}) {
    SCOPED_TRACE(save);
    CaptureOptions options;
    options.save_activations = save;
    absl::StatusOr<Trace> trace = Capture("recurrent_loop", options);
    ASSERT_TRUE(trace.ok()) << trace.status();
    const Buffer& h = trace->buffers().at("h");
    EXPECT_EQ(h.num_overwrites, 4);  // four steps, four reassignments
    EXPECT_TRUE(Equal(h.final_value, expected.buffer("h")));
    EXPECT_TRUE(Equal(h.initial_value, expected.initial_buffer("h")));
  }
}

// NOTE [Former holders kept alive]: without saved values each step's former state dies
// when the model drops it, and a new tensor at its address is told apart by its version
// counter. The edges are those of a saved capture, which keeps them all alive: step k's
// linear reads version k of `h`, and version k + 1 is step k's tanh.
TEST(BuffersTest, UnsavedRecurrentStateKeepsItsEdgesAsStepsAreFreed) {
  CaptureOptions unsaved;
  unsaved.save_activations = false;
  absl::StatusOr<Trace> saved_trace = Capture("recurrent_loop");
  absl::StatusOr<Trace> unsaved_trace = Capture("recurrent_loop", unsaved);
  ASSERT_TRUE(saved_trace.ok()) << saved_trace.status();
  ASSERT_TRUE(unsaved_trace.ok()) << unsaved_trace.status();
  for (const Trace* trace : {&*saved_trace, &*unsaved_trace}) {
    SCOPED_TRACE(trace->has_saved_values());
    const Buffer& h = trace->buffers().at("h");
    ASSERT_EQ(h.versions.size(), 5u);  // the initial read, then four reassignments
    const std::vector<const Op*> linears = testing_util::OpsOfType(*trace, "linear");
    const std::vector<const Op*> tanhs = testing_util::OpsOfType(*trace, "tanh");
    ASSERT_EQ(linears.size(), 4u);
    ASSERT_EQ(tanhs.size(), 4u);
    for (size_t k = 0; k < 4; ++k) {
      EXPECT_THAT(linears[k]->parents, ElementsAre(h.versions[k]->label)) << k;
      EXPECT_THAT(h.versions[k + 1]->parents, ElementsAre(tanhs[k]->label)) << k;
    }
  }
  ASSERT_EQ(testing_util::Labels(*saved_trace), testing_util::Labels(*unsaved_trace));
  for (size_t i = 0; i < saved_trace->ops().size(); ++i) {
    EXPECT_EQ(saved_trace->ops()[i].parents, unsaved_trace->ops()[i].parents)
        << saved_trace->ops()[i].label;
  }
}

TEST(BuffersTest, RawWriteAfterUnsavedReassignmentIsUnjournaled) {
  testdata::Expected expected("recurrent_loop");
  for (bool allow : {false, true}) {
    SCOPED_TRACE(allow);
    torch::jit::Module model = testdata::LoadModel("recurrent_loop");
    CaptureOptions options;
    options.save_activations = false;
    options.allow_unjournaled_writes = allow;
    CaptureGuard guard(model, options);
    const c10::IValue out = model.forward(expected.inputs());
    // An op after the forward: the capture sees the last step's reassignment before it.
    const at::Tensor doubled = out.toTensor() * 2.0;
    // Then a write no dispatcher sees, into the tensor that step reassigned.
    at::Tensor h = model.attr("h").toTensor();
    h.data_ptr<float>()[1] += 1.0f;
    absl::StatusOr<Trace> trace = guard.Finish(c10::IValue(doubled));
    if (!allow) {
      EXPECT_EQ(trace.status().code(), absl::StatusCode::kFailedPrecondition);
      EXPECT_THAT(std::string(trace.status().message()), HasSubstr("\"h\""));
      continue;
    }
    ASSERT_TRUE(trace.ok()) << trace.status();
    ASSERT_EQ(trace->diagnostics().size(), 1u);
    EXPECT_EQ(trace->diagnostics()[0].address, "h");
    // The value at the end, the one the model holds, independent of it.
    at::Tensor changed = expected.buffer("h").clone();
    changed[1] += 1.0f;
    EXPECT_TRUE(Equal(trace->buffers().at("h").final_value, changed));
    EXPECT_NE(trace->buffers().at("h").final_value.data_ptr(), h.data_ptr());
  }
}

// Without saved values, written and reassigned states are kept by reference (NOTE
// [Reassigned values by reference]): the same versions, flags and final values as a saved
// capture, whose final values are eager PyTorch's.
TEST(BuffersTest, UnsavedCaptureEndsWithTheSavedCapturesStates) {
  for (const char* name :
       {"mul_add", "counter_cell", "bn1d_train", "bn2d_train", "slice_copy", "copy_into",
        "many_buffers", "recurrent_loop", "reassign_then_write", "reassigned_statistics",
        "instancenorm_train", "double_reassign", "set_storage", "data_copy", "shared_storage",
        "transposed_write", "slice_assign"}) {
    SCOPED_TRACE(name);
    testdata::Expected expected(name);
    absl::StatusOr<Trace> saved = Capture(name);
    CaptureOptions options;
    options.save_activations = false;
    absl::StatusOr<Trace> unsaved = Capture(name, options);
    ASSERT_TRUE(saved.ok()) << saved.status();
    ASSERT_TRUE(unsaved.ok()) << unsaved.status();
    ASSERT_EQ(unsaved->buffers().size(), saved->buffers().size());
    for (const auto& [address, buffer] : saved->buffers()) {
      SCOPED_TRACE(address);
      const Buffer& other = unsaved->buffers().at(address);
      EXPECT_TRUE(Equal(buffer.final_value, expected.buffer(address)));
      EXPECT_TRUE(Equal(other.final_value, expected.buffer(address)));
      ASSERT_EQ(other.versions.size(), buffer.versions.size());
      for (size_t v = 0; v < buffer.versions.size(); ++v) {
        EXPECT_EQ(KindOf(other.versions[v]), KindOf(buffer.versions[v])) << v;
        EXPECT_EQ(other.versions[v]->buffer_value_changed, buffer.versions[v]->buffer_value_changed)
            << v;
      }
    }
  }
}

// With saved values, the reassignment's version shares its producer's saved value, which
// copy-on-write keeps as it was when the state is then written in place.
TEST(BuffersTest, ReassignedValueSurvivesAnInPlaceWrite) {
  testdata::Expected expected("reassign_then_write");
  absl::StatusOr<Trace> trace = Capture("reassign_then_write");
  ASSERT_TRUE(trace.ok()) << trace.status();
  const Buffer& h = trace->buffers().at("h");
  ASSERT_EQ(h.versions.size(), 2u);
  EXPECT_EQ(KindOf(h.versions[0]), WriteKind::kReassign);
  EXPECT_EQ(KindOf(h.versions[1]), WriteKind::kInplace);
  // x = [1, -2]: h = 2x, then h += 1; the output is 3h.
  EXPECT_TRUE(Equal(*h.value_after(1), Values({2.0f, -4.0f})));
  EXPECT_TRUE(Equal(*h.value_after(2), Values({3.0f, -3.0f})));
  EXPECT_TRUE(Equal(h.final_value, expected.buffer("h")));
  EXPECT_TRUE(Equal(Get(*trace, "output_1").out, Values({9.0f, -9.0f})));
  EXPECT_TRUE(Equal(Get(*trace, "output_1").out, expected.output(0)));
}

// A fused write after a reassignment tells a changed value from the reassigned one, so
// the reassigned value must be kept as it was before the kernel wrote it.
TEST(BuffersTest, FusedWriteAfterReassignmentSeesTheChange) {
  testdata::Expected expected("reassigned_statistics");
  for (bool save : {true, false}) {
    SCOPED_TRACE(save);
    CaptureOptions options;
    options.save_activations = save;
    absl::StatusOr<Trace> trace = Capture("reassigned_statistics", options);
    ASSERT_TRUE(trace.ok()) << trace.status();
    const Buffer& mean = trace->buffers().at("mean");
    ASSERT_EQ(mean.versions.size(), 2u);
    EXPECT_EQ(KindOf(mean.versions[0]), WriteKind::kReassign);
    EXPECT_EQ(KindOf(mean.versions[1]), WriteKind::kFused);
    EXPECT_EQ(mean.versions[1]->buffer_value_changed, true);
    EXPECT_TRUE(Equal(mean.final_value, expected.buffer("mean")));
    EXPECT_TRUE(Equal(trace->buffers().at("var").final_value, expected.buffer("var")));
    if (save) {
      EXPECT_TRUE(Equal(Get(*trace, "output_1").out, expected.output(0)));
    }
  }
}

TEST(BuffersTest, UnsavedCaptureStillTracksVersions) {
  CaptureOptions options;
  options.save_activations = false;
  absl::StatusOr<Trace> trace = Capture("mul_add", options);
  ASSERT_TRUE(trace.ok()) << trace.status();
  const Buffer& b = trace->buffers().at("b");
  EXPECT_EQ(b.num_overwrites, 2);
  EXPECT_EQ(b.value_at(2).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Equal(b.initial_value, Values({1.0f, 1.0f})));
}

}  // namespace
}  // namespace torchlens
