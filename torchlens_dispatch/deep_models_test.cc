// Models nested thousands of modules deep, as LibTorch's pickler saves them (NOTE [Pickle
// nesting by file kind] in graph/pickle_values.h): their archives pass the checks, and
// LibTorch loads them on the loader's large stack (NOTE [Calls LibTorch compiles by
// recursion] in large_stack.h), where torchlens captures and validates them.
#include <torch/script.h>
#include <torch/torch.h>

#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "graph/archive_check.h"
#include "gtest/gtest.h"
#include "tools/nested_modules.h"
#include "torchlens_dispatch/capture.h"
#include "torchlens_dispatch/load_model.h"
#include "validation/validate.h"

namespace torchlens {
namespace {

// The archive of NestedModules(depth, weight), as torch.jit.save writes it.
std::string NestedArchive(int depth, const at::Tensor& weight) {
  std::stringstream saved;
  NestedModules(depth, weight).save(saved);
  return saved.str();
}

// Loads the archive of `depth` nested modules through torchlens' loader (its checks, then
// LibTorch on the large stack), captures it and validates the trace.
void LoadCaptureAndValidate(int depth) {
  const at::Tensor weight = torch::tensor({{1.0f, -2.0f}, {0.5f, 3.0f}});
  const std::string bytes = NestedArchive(depth, weight);
  absl::StatusOr<CheckedArchive> checked = CheckTorchArchive(bytes, ArchiveKind::kTorchScript);
  ASSERT_TRUE(checked.ok()) << checked.status();
  absl::StatusOr<torch::jit::Module> model =
      LoadTorchScriptFromBytes(bytes, absl::StrCat("nested", depth, ".pt"));
  ASSERT_TRUE(model.ok()) << model.status();
  model->eval();
  const at::Tensor x = torch::tensor({{1.0f, 1.0f}});
  absl::StatusOr<Trace> trace = TraceModule(*model, {x});
  ASSERT_TRUE(trace.ok()) << trace.status();
  // relu(x @ W) = relu([1.5, 1.0]); the relus after it change nothing.
  const Op& output = **trace->Find("output_1");
  EXPECT_TRUE(torch::equal(output.out, torch::tensor({{1.5f, 1.0f}})));
  EXPECT_EQ(trace->modules().size(), static_cast<size_t>(depth + 1));
  absl::StatusOr<ValidationReport> report = ValidateForwardPass(*trace);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->passed);
  EXPECT_EQ(report->ops_checked, depth + 2);  // the mm, the relus, the output
}

TEST(DeepModelsTest, AThousandLevels) { LoadCaptureAndValidate(1000); }

// Twice as deep, loaded: LibTorch's first run inlines the chain in cubic time, so the
// capture is left to the thousand levels above.
TEST(DeepModelsTest, TwoThousandLevelsLoad) {
  const std::string bytes = NestedArchive(2000, torch::eye(2));
  absl::StatusOr<torch::jit::Module> model = LoadTorchScriptFromBytes(bytes, "nested2000.pt");
  ASSERT_TRUE(model.ok()) << model.status();
  int depth = 0;
  for (torch::jit::Module module = *model; module.hasattr("inner");
       module = module.attr("inner").toModule()) {
    ++depth;
  }
  EXPECT_EQ(depth, 2000);
}

}  // namespace
}  // namespace torchlens
