// Walks over a trace read from a file give its values' pages back after their last use
// (NOTE [Giving back a mapped value's pages], NOTE [Releasing after the last use]): the
// pages of the file's mapping resident after validation, Compare, FirstNonFinite and Do
// are a working set, not the file, as the kernel counts them in /proc/self/smaps, and
// nothing read or written through the mapping changes.
#include <torch/torch.h>

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "graph/compare.h"
#include "graph/mapped_storage.h"
#include "graph/mapping_resident.h"
#include "graph/non_finite.h"
#include "graph/trace_file.h"
#include "gtest/gtest.h"
#include "torchlens_dispatch/capture.h"
#include "validation/intervene.h"
#include "validation/validate.h"

namespace torchlens {
namespace {

constexpr int64_t kLayers = 8;
constexpr int64_t kRows = 8192;
constexpr int64_t kWidth = 256;  // each value: 8 MiB
constexpr int64_t kValueBytes = kRows * kWidth * 4;

// A trace file of kLayers Linear + ReLU layers over [kRows, kWidth] (about 2 kLayers
// values of 8 MiB), written once per test program.
const std::string& TraceFile() {
  static const std::string* path = [] {
    auto* file = new std::string(absl::StrCat(::testing::TempDir(), "/pages_released.pt"));
    torch::manual_seed(0);
    torch::nn::Sequential model;
    for (int64_t i = 0; i < kLayers; ++i) {
      model->push_back(torch::nn::Linear(kWidth, kWidth));
      model->push_back(torch::nn::ReLU());
    }
    model->eval();
    torch::NoGradGuard no_grad;
    const at::Tensor x = torch::randn({kRows, kWidth});
    CaptureGuard guard(*model);
    const at::Tensor y = model->forward(x);
    absl::StatusOr<Trace> trace = guard.Finish(y);
    EXPECT_TRUE(trace.ok()) << trace.status();
    if (trace.ok()) {
      EXPECT_TRUE(SaveTrace(*trace, *file).ok());
    }
    return file;
  }();
  return *path;
}

Trace Load() {
  absl::StatusOr<Trace> trace = LoadTrace(TraceFile());
  EXPECT_TRUE(trace.ok()) << trace.status();
  return trace.ok() ? *std::move(trace) : Trace();
}

const at::Tensor& LastOutput(const Trace& trace) {
  return trace.ops()[trace.ops().size() - 2].out;  // the last ReLU (before the output node)
}

// The baseline that makes the other tests mean something: reading every value leaves the
// whole file resident until memory runs short.
TEST(PagesReleasedTest, ReadingEveryValueKeepsTheFileResident) {
  const Trace trace = Load();
  double sum = 0;
  for (const Op& op : trace.ops()) {
    if (op.out.defined()) sum += op.out.sum().item<double>();
  }
  EXPECT_NE(sum, 0);
  EXPECT_GT(ResidentBytesOfMappingAt(LastOutput(trace).data_ptr()),
            2 * kLayers * kValueBytes * 9 / 10);
}

TEST(PagesReleasedTest, ValidationKeepsAWorkingSet) {
  const Trace trace = Load();
  absl::StatusOr<ValidationReport> report = ValidateForwardPass(trace);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->passed);
  // The last values checked may stay; the file's other values are given back.
  EXPECT_LT(ResidentBytesOfMappingAt(LastOutput(trace).data_ptr()), 4 * kValueBytes);
}

TEST(PagesReleasedTest, CompareKeepsAWorkingSetOfBothFiles) {
  const Trace a = Load();
  const Trace b = Load();
  absl::StatusOr<Comparison> comparison = Compare(a, b);
  ASSERT_TRUE(comparison.ok()) << comparison.status();
  EXPECT_FALSE(comparison->first_divergence.has_value());
  ASSERT_EQ(comparison->nodes.size(), a.ops().size());
  EXPECT_EQ(comparison->nodes.back().max_abs_diff, 0);
  EXPECT_LT(ResidentBytesOfMappingAt(LastOutput(a).data_ptr()), 2 * kValueBytes);
  EXPECT_LT(ResidentBytesOfMappingAt(LastOutput(b).data_ptr()), 2 * kValueBytes);
}

TEST(PagesReleasedTest, LookingForNaNKeepsAWorkingSet) {
  const Trace trace = Load();
  absl::StatusOr<std::optional<NonFinite>> first = FirstNonFinite(trace);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(first->has_value());
  EXPECT_LT(ResidentBytesOfMappingAt(LastOutput(trace).data_ptr()), 2 * kValueBytes);
}

// NOTE [Forks that keep only their results]: an edit of the first value replays the
// whole file, and keeps its working set.
TEST(PagesReleasedTest, DoOfTheWholeConeKeepingOnlyResults) {
  const Trace trace = Load();
  size_t at = 0;
  while (at < trace.ops().size() && trace.ops()[at].type != "addmm") ++at;
  ASSERT_LT(at, trace.ops().size());
  const Op& first = trace.ops()[at];
  DoOptions options;
  options.keep_values = false;
  absl::StatusOr<DoResult> result =
      Do(trace, {Edit{first.label, at::zeros_like(first.out)}}, options);
  ASSERT_TRUE(result.ok()) << result.status();
  // Every addmm and relu after the edited one was re-executed, and dropped.
  EXPECT_EQ(result->reexecuted.size(), 2 * kLayers - 1);
  for (const std::string& label : result->reexecuted) {
    EXPECT_FALSE((*result->trace.Find(label))->out.defined()) << label;
  }
  // The output is what the fork keeping every value gives.
  absl::StatusOr<DoResult> kept = Do(trace, {Edit{first.label, at::zeros_like(first.out)}});
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_TRUE(at::equal(result->trace.ops().back().out, kept->trace.ops().back().out));
  EXPECT_LT(ResidentBytesOfMappingAt(LastOutput(trace).data_ptr()), 2 * kValueBytes);
}

TEST(PagesReleasedTest, DoReadsItsConeAndGivesItBack) {
  const Trace trace = Load();
  const Op& last_linear = trace.ops()[trace.ops().size() - 3];
  ASSERT_EQ(last_linear.type, "addmm");  // torch::nn::Linear's bias + input @ weight.T
  Edit edit{last_linear.label, at::zeros_like(last_linear.out)};
  absl::StatusOr<DoResult> result = Do(trace, {edit});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(at::count_nonzero(result->trace.ops().back().out).item<int64_t>(), 0);
  EXPECT_LT(ResidentBytesOfMappingAt(LastOutput(trace).data_ptr()), 2 * kValueBytes);
}

// The advice never loses data: a value given back is read again from the file, and a
// value this process wrote keeps what it wrote (its pages are private copies, which the
// kernel cannot drop).
TEST(PagesReleasedTest, ReleasedValuesReadBackAndWritesSurvive) {
  const Trace trace = Load();
  const at::Tensor& read = LastOutput(trace);
  const at::Tensor& written = trace.ops()[trace.ops().size() - 3].out;
  const at::Tensor copy = read.clone();
  written.fill_(7);
  const std::optional<absl::string_view> file = MappingOf(read.storage());
  ASSERT_TRUE(file.has_value());
  EXPECT_EQ(MappingOf(written.storage())->data(), file->data());
  ReleaseMappedPages(file->data(), file->data() + file->size());
  EXPECT_LT(ResidentBytesOfMappingAt(read.data_ptr()), 2 * kValueBytes);
  EXPECT_TRUE(at::equal(read, copy));
  EXPECT_TRUE(at::equal(written, at::full_like(written, 7)));
  // The file itself is unchanged: another load reads the captured value.
  EXPECT_FALSE(at::equal(Load().ops()[trace.ops().size() - 3].out, at::full_like(written, 7)));
}

}  // namespace
}  // namespace torchlens
