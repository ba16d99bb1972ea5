// The example service on a batch of requests, some marked for capture: every answer equals
// the uncaptured reference, exactly the marked requests leave traces, and each validates.
#include "tools/serve/service.h"

#include <dirent.h>
#include <sys/stat.h>
#include <torch/torch.h>

#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "graph/trace_file.h"
#include "gtest/gtest.h"
#include "testdata/testdata.h"
#include "validation/validate.h"

namespace torchlens {
namespace serve {
namespace {

std::set<std::string> Files(const std::string& dir) {
  std::set<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* entry = ::readdir(d)) {
      const std::string name = entry->d_name;
      if (name != "." && name != "..") names.insert(name);
    }
    ::closedir(d);
  }
  return names;
}

TEST(ServiceTest, CapturesExactlyTheMarkedRequestsAndAnswersAllCorrectly) {
  const std::set<int> marked = {1, 6, 13};
  torch::manual_seed(0);
  std::vector<Request> requests;
  for (int id = 0; id < 16; ++id) {
    requests.push_back({id, torch::randn({2, 1, 5, 5}), marked.count(id) > 0});
  }
  // The reference: the same model, uncaptured, one request at a time.
  torch::jit::Module reference = testdata::LoadModel("convbn_eval");
  std::vector<at::Tensor> expected;
  {
    torch::NoGradGuard no_grad;
    for (const Request& request : requests) {
      expected.push_back(reference.forward({request.input}).toTensor());
    }
  }
  const std::string out_dir = testing::TempDir();
  Service service(testdata::LoadModel("convbn_eval"), {4, out_dir});
  const std::vector<Answer> answers = service.Serve(requests);
  ASSERT_EQ(answers.size(), requests.size());
  std::set<std::string> expected_files;
  for (const Answer& answer : answers) {
    SCOPED_TRACE(answer.id);
    EXPECT_TRUE(answer.status.ok()) << answer.status;
    ASSERT_TRUE(answer.output.defined());
    EXPECT_TRUE(at::allclose(answer.output, expected[answer.id], 1e-6, 1e-6));
    EXPECT_TRUE(at::equal(answer.output, expected[answer.id]));
    EXPECT_EQ(answer.trace_file.empty(), marked.count(answer.id) == 0);
    if (marked.count(answer.id) == 0) continue;
    expected_files.insert(absl::StrCat("request_", answer.id, ".trace.pt"));
    expected_files.insert(absl::StrCat("request_", answer.id, ".svg"));
    absl::StatusOr<Trace> trace = LoadTrace(answer.trace_file);
    ASSERT_TRUE(trace.ok()) << trace.status();
    EXPECT_EQ(answer.captured_ops, 5);  // conv2d, batch_norm, relu, flatten, linear
    absl::StatusOr<const Op*> input = trace->Find("input_1");
    absl::StatusOr<const Op*> output = trace->Find("output_1");
    ASSERT_TRUE(input.ok() && output.ok()) << input.status() << output.status();
    EXPECT_TRUE(at::equal((*input)->out, requests[answer.id].input));
    EXPECT_TRUE(at::equal((*output)->out, expected[answer.id]));
    absl::StatusOr<ValidationReport> report = ValidateForwardPass(*trace);
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_TRUE(report->passed) << absl::StrJoin(report->failures, "\n");
  }
  EXPECT_EQ(Files(out_dir), expected_files);
}

// Sampling: one request in N is captured whatever the workers' order, the writer keeps the
// newest traces only, and a per-trace byte budget gives partial traces that still validate.
TEST(ServiceTest, SamplesOneInNKeepsTheNewestTracesAndBoundsEachTrace) {
  torch::manual_seed(1);
  std::vector<Request> requests;
  for (int id = 0; id < 24; ++id) requests.push_back({id, torch::randn({2, 1, 5, 5}), false});
  torch::jit::Module reference = testdata::LoadModel("convbn_eval");
  const std::string out_dir = absl::StrCat(testing::TempDir(), "/sampled");
  ASSERT_EQ(::mkdir(out_dir.c_str(), 0755), 0);
  ServiceOptions options;
  options.workers = 3;
  options.out_dir = out_dir;
  options.capture_one_in = 4;
  options.max_traces_kept = 2;
  options.max_trace_bytes = 256;  // the input alone is 200 bytes
  options.render_graphs = false;
  Service service(testdata::LoadModel("convbn_eval"), options);
  const std::vector<Answer> answers = service.Serve(requests);
  int captured = 0;
  for (const Answer& answer : answers) {
    SCOPED_TRACE(answer.id);
    EXPECT_TRUE(answer.status.ok()) << answer.status;
    torch::NoGradGuard no_grad;
    EXPECT_TRUE(
        at::equal(answer.output, reference.forward({requests[answer.id].input}).toTensor()));
    if (answer.trace_file.empty()) continue;
    ++captured;
    EXPECT_TRUE(answer.partial);
  }
  EXPECT_EQ(captured, 6);  // arrivals 0, 4, 8, 12, 16, 20
  const std::set<std::string> kept = Files(out_dir);
  ASSERT_EQ(kept.size(), 2u) << absl::StrJoin(kept, ", ");
  for (const std::string& name : kept) {
    absl::StatusOr<Trace> trace = LoadTrace(absl::StrCat(out_dir, "/", name));
    ASSERT_TRUE(trace.ok()) << trace.status();
    EXPECT_TRUE(trace->partial());
    EXPECT_THAT(trace->partial_reason(), ::testing::HasSubstr("max_saved_bytes"));
    absl::StatusOr<ValidationReport> report = ValidateForwardPass(*trace);
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_TRUE(report->passed) << absl::StrJoin(report->failures, "\n");
    EXPECT_FALSE(report->not_checked.empty());
  }
}

}  // namespace
}  // namespace serve
}  // namespace torchlens
