// CaptureOptions::trace_file: values written to a trace file as they are captured
// (graph/trace_file_writer.h). The file holds, bit for bit, what a capture in memory holds,
// validates, and is never left half written.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/trace_file.h"
#include "graph/trace_file_writer.h"
#include "testdata/testdata.h"
#include "tools/allocator_peak.h"
#include "torchlens_dispatch/capture.h"
#include "torchlens_dispatch/ops/ivalue_tensors.h"
#include "validation/validate.h"

namespace torchlens {
namespace {

using ::testing::HasSubstr;

std::string Temp(const std::string& name) { return absl::StrCat(testing::TempDir(), "/", name); }

bool Exists(const std::string& path) {
  struct stat info;
  return ::stat(path.c_str(), &info) == 0;
}

// Equal values; a dense one with the same strides (a replay reads them: Record::strides).
bool SameTensor(const at::Tensor& a, const at::Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  if (b.is_non_overlapping_and_dense() && a.strides() != b.strides()) return false;
  return a.dtype() == b.dtype() && a.sizes() == b.sizes() && at::equal(a, b);
}

std::vector<at::Tensor> TensorsOf(const SharedVector<c10::IValue>& args) {
  std::vector<at::Tensor> tensors;
  for (const c10::IValue& arg : args) {
    ForEachTensor(arg, [&](const at::Tensor& t) { tensors.push_back(t); });
  }
  return tensors;
}

// Every value of `disk` equals the one `memory` (the same model captured in memory) holds.
void ExpectSameValues(const Trace& memory, const Trace& disk) {
  ASSERT_TRUE(disk.has_saved_values());
  ASSERT_EQ(disk.ops().size(), memory.ops().size());
  for (size_t i = 0; i < memory.ops().size(); ++i) {
    const Op& m = memory.ops()[i];
    const Op& d = disk.ops()[i];
    SCOPED_TRACE(m.label);
    EXPECT_EQ(d.label, m.label);
    EXPECT_EQ(d.parents, m.parents);
    ASSERT_EQ(d.outs.size(), m.outs.size());
    for (size_t k = 0; k < m.outs.size(); ++k) EXPECT_TRUE(SameTensor(d.outs[k], m.outs[k])) << k;
    EXPECT_TRUE(SameTensor(d.out, m.out));
    ASSERT_EQ(d.alias_writes.size(), m.alias_writes.size());
    for (size_t k = 0; k < m.alias_writes.size(); ++k) {
      EXPECT_TRUE(SameTensor(d.alias_writes[k].value, m.alias_writes[k].value));
      EXPECT_EQ(d.alias_writes[k].aliased.sizes, m.alias_writes[k].aliased.sizes);
      EXPECT_EQ(d.alias_writes[k].aliased.strides, m.alias_writes[k].aliased.strides);
      EXPECT_EQ(d.alias_writes[k].aliased.storage_offset, m.alias_writes[k].aliased.storage_offset);
    }
    const std::vector<at::Tensor> disk_args = TensorsOf(d.creation_args);
    const std::vector<at::Tensor> memory_args = TensorsOf(m.creation_args);
    ASSERT_EQ(disk_args.size(), memory_args.size());
    for (size_t a = 0; a < memory_args.size(); ++a) {
      EXPECT_TRUE(SameTensor(disk_args[a], memory_args[a])) << "argument tensor " << a;
    }
    EXPECT_TRUE(SameTensor(d.rng_state, m.rng_state));
  }
  ASSERT_EQ(disk.buffers().size(), memory.buffers().size());
  for (const auto& [address, buffer] : memory.buffers()) {
    const Buffer& d = disk.buffers().at(address);
    EXPECT_TRUE(SameTensor(d.initial_value, buffer.initial_value)) << address;
    EXPECT_TRUE(SameTensor(d.final_value, buffer.final_value)) << address;
  }
}

TEST(TraceFileCaptureTest, TheFileHoldsWhatACaptureInMemoryHolds) {
  for (const char* name :
       {"mlp", "bn2d_train", "counter_cell", "view_write", "slice_assign", "pad_through_view",
        "transposed_write", "dropout_train", "recurrent_loop", "multi_output", "return_param",
        "param_view_writes", "transposed_matmul", "strided_reads"}) {
    SCOPED_TRACE(name);
    testdata::Expected expected(name);
    torch::jit::Module memory_model = testdata::LoadModel(name);
    at::manual_seed(3);
    absl::StatusOr<Trace> memory = TraceModule(memory_model, expected.inputs());
    ASSERT_TRUE(memory.ok()) << memory.status();

    torch::jit::Module model = testdata::LoadModel(name);
    CaptureOptions options;
    options.trace_file = Temp(absl::StrCat(name, ".trace.pt"));
    at::manual_seed(3);
    absl::StatusOr<Trace> disk = TraceModule(model, expected.inputs(), options);
    ASSERT_TRUE(disk.ok()) << disk.status();
    EXPECT_TRUE(Exists(options.trace_file));
    EXPECT_FALSE(Exists(options.trace_file + ".partial"));
    ExpectSameValues(*memory, *disk);
    absl::StatusOr<Trace> loaded = LoadTrace(options.trace_file);  // the file itself
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    ExpectSameValues(*memory, *loaded);
    // The model's first output as eager PyTorch computed it, read from the file (dropout
    // draws other numbers here than in the generator).
    const absl::StatusOr<const Op*> output = disk->Find("output_1");
    ASSERT_TRUE(output.ok()) << output.status();
    if (std::string(name) != "dropout_train") {
      EXPECT_TRUE(at::allclose((*output)->out, expected.output(0), 1e-5, 1e-6));
    }
    absl::StatusOr<ValidationReport> report = ValidateForwardPass(*disk);
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_TRUE(report->passed) << ValidationReportToJson(*report);
  }
}

// NOTE [Streamed values keep their strides]: slices with gaps and an expanded value are
// written with the strides the reductions read, in their span of bytes.
TEST(TraceFileCaptureTest, StridedAndExpandedValuesKeepTheirStrides) {
  testdata::Expected expected("strided_reads");
  torch::jit::Module model = testdata::LoadModel("strided_reads");
  CaptureOptions options;
  options.trace_file = Temp("strided_reads.strides.pt");
  absl::StatusOr<Trace> disk = TraceModule(model, expected.inputs(), options);
  ASSERT_TRUE(disk.ok()) << disk.status();
  absl::StatusOr<Trace> loaded = LoadTrace(options.trace_file);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  std::vector<std::vector<int64_t>> strides;
  for (const Op& op : loaded->ops()) {
    if (op.type == "slice" || op.type == "expand") strides.push_back(op.out.strides().vec());
  }
  // y is 64 x 128: y[:, ::2] (one slice of the rows, then one of the columns), y[::3, ::2],
  // y[:1].expand(512, 128).
  using Strides = std::vector<int64_t>;
  EXPECT_THAT(strides, ::testing::ElementsAre(Strides{128, 1}, Strides{128, 2}, Strides{384, 1},
                                              Strides{384, 2}, Strides{128, 1}, Strides{0, 1}));
  const absl::StatusOr<const Op*> expanded = loaded->Find("output_3");
  ASSERT_TRUE(expanded.ok()) << expanded.status();
  EXPECT_TRUE(at::allclose((*expanded)->out, expected.output(2), 1e-5, 1e-6));
  absl::StatusOr<ValidationReport> report = ValidateForwardPass(*loaded);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->passed) << ValidationReportToJson(*report);
}

TEST(TraceFileCaptureTest, AHaltedCaptureWritesItsPartialTrace) {
  testdata::Expected expected("demo");
  torch::jit::Module model = testdata::LoadModel("demo");
  CaptureOptions options;
  options.trace_file = Temp("halted.trace.pt");
  options.halt_after = "block1";
  absl::StatusOr<Trace> disk = TraceModule(model, expected.inputs(), options);
  ASSERT_TRUE(disk.ok()) << disk.status();
  EXPECT_TRUE(disk->partial());
  EXPECT_THAT(disk->partial_reason(), HasSubstr("block1"));
  absl::StatusOr<Trace> loaded = LoadTrace(options.trace_file);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->ops().size(), disk->ops().size());
  EXPECT_TRUE(loaded->partial());
}

TEST(TraceFileCaptureTest, ConflictingOptionsAreRefusedBeforeAnyFile) {
  torch::jit::Module model = testdata::LoadModel("mlp");
  testdata::Expected expected("mlp");
  CaptureOptions options;
  options.trace_file = Temp("refused.trace.pt");
  options.save_activations = false;
  absl::StatusOr<Trace> trace = TraceModule(model, expected.inputs(), options);
  EXPECT_EQ(trace.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(trace.status().message()), HasSubstr("save_activations"));
  EXPECT_FALSE(Exists(options.trace_file + ".partial"));

  options.trace_file = "/nonexistent-torchlens-dir/x.pt";
  options.save_activations = true;
  trace = TraceModule(model, expected.inputs(), options);
  EXPECT_EQ(trace.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(trace.status().message()), HasSubstr("/nonexistent-torchlens-dir/x.pt"));
}

// NOTE [Partial trace files]: a forward that throws leaves the earlier file as it was.
TEST(TraceFileCaptureTest, AFailedCaptureLeavesTheEarlierFile) {
  const std::string path = Temp("kept.trace.pt");
  testdata::Expected mlp("mlp");
  torch::jit::Module model = testdata::LoadModel("mlp");
  CaptureOptions options;
  options.trace_file = path;
  ASSERT_TRUE(TraceModule(model, mlp.inputs(), options).ok());

  // `raises` throws from its forward when x[0, 0] < 0.
  torch::jit::Module raises = testdata::LoadModel("raises");
  absl::StatusOr<Trace> failed =
      TraceModule(raises, {-testdata::Expected("raises").input(0)}, options);
  EXPECT_FALSE(failed.ok());
  EXPECT_FALSE(Exists(path + ".partial"));
  absl::StatusOr<Trace> kept = LoadTrace(path);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_TRUE(at::allclose(kept->ops().back().out, mlp.output(0), 1e-5, 1e-6));
}

// NOTE [Streaming without saving]: a capture to disk holds no value. Allocator
// accounting, not timing: a capture in memory ends holding its activations above the plain
// forward's peak, one to disk at most the copies its writer thread has queued (NOTE
// [Writing off the capturing thread]), whatever the model's size.
TEST(TraceFileCaptureTest, ValuesDoNotStayInMemory) {
  torch::manual_seed(0);
  torch::nn::Sequential net;
  for (int i = 0; i < 16; ++i) {
    net->push_back(torch::nn::Linear(512, 512));
    net->push_back(torch::nn::ReLU());
  }
  const torch::Tensor x = torch::randn({1024, 512});  // 2 MiB per activation
  torch::NoGradGuard no_grad;
  const int64_t plain = PeakAllocatedDuring([&] { net->forward(x); });
  const int64_t in_memory = PeakAllocatedDuring([&] {
    CaptureGuard guard(*net);
    absl::StatusOr<Trace> trace = guard.Finish(net->forward(x));
    ASSERT_TRUE(trace.ok()) << trace.status();
  });
  CaptureOptions options;
  options.trace_file = Temp("bounded.trace.pt");
  const int64_t to_disk = PeakAllocatedDuring([&] {
    CaptureGuard guard(*net, options);
    absl::StatusOr<Trace> trace = guard.Finish(net->forward(x));
    ASSERT_TRUE(trace.ok()) << trace.status();
    EXPECT_TRUE(trace->has_saved_values());
    int activations_read = 0;  // the C++ Linear runs as t and addmm
    for (const Op& op : trace->ops()) {
      if ((op.type == "addmm" || op.type == "relu") && op.out.defined()) {
        activations_read += op.out.numel() == 1024 * 512;
      }
    }
    EXPECT_EQ(activations_read, 32);
  });
  // The activations: 16 linear and 16 relu outputs of 1024 x 512 floats.
  const int64_t activation = int64_t{1024} * 512 * 4;
  const int64_t activations = 32 * activation;
  struct stat info;
  ASSERT_EQ(::stat(options.trace_file.c_str(), &info), 0);
  EXPECT_GT(info.st_size, activations);  // with the weights the linears read
  EXPECT_GT(in_memory - plain, activations * 9 / 10);
  // The copies the writer thread has yet to write, at most, and the one being made.
  EXPECT_LT(to_disk - plain, TraceFileWriter::kQueueBytes + activation)
      << "to disk " << to_disk << ", plain " << plain;
}

// NOTE [Values read on use]: tensors over the file are writable, and a write never reaches
// the file.
TEST(TraceFileCaptureTest, WritingALoadedValueLeavesTheFile) {
  const std::string path = Temp("written.trace.pt");
  testdata::Expected expected("mlp");
  torch::jit::Module model = testdata::LoadModel("mlp");
  CaptureOptions options;
  options.trace_file = path;
  absl::StatusOr<Trace> disk = TraceModule(model, expected.inputs(), options);
  ASSERT_TRUE(disk.ok()) << disk.status();
  at::Tensor out = disk->ops().back().out;
  const at::Tensor before = out.clone();
  out.add_(1);
  EXPECT_TRUE(at::equal(out, before + 1));
  absl::StatusOr<Trace> again = LoadTrace(path);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(at::equal(again->ops().back().out, before));
}

}  // namespace
}  // namespace torchlens
