// Capture is per thread: other threads run untouched, and concurrent captures of
// different models produce complete, independent traces.
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/script.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testdata/testdata.h"
#include "torchlens_dispatch/capture.h"

namespace torchlens {
namespace {

std::vector<std::string> Labels(const Trace& trace) {
  std::vector<std::string> labels;
  for (const Op& op : trace.ops()) labels.push_back(op.label);
  return labels;
}

at::Tensor RunReference(torch::jit::Module& model, const testdata::Expected& expected) {
  torch::jit::GraphOptimizerEnabledGuard same_settings(false);
  return model.forward(expected.inputs()).toTensor();
}

TEST(ThreadsTest, UncapturedThreadIsUntouchedWhileAnotherCaptures) {
  torch::jit::Module model = testdata::LoadModel("convbn_eval");
  testdata::Expected expected("convbn_eval");
  const at::Tensor reference = RunReference(model, expected);
  absl::StatusOr<Trace> single = TraceModule(model, expected.inputs());
  ASSERT_TRUE(single.ok()) << single.status();

  std::atomic<bool> capturing_done{false};
  std::atomic<int> mismatches{0};
  std::atomic<int> uncaptured_runs{0};
  std::thread uncaptured([&] {
    torch::jit::GraphOptimizerEnabledGuard same_settings(false);
    while (!capturing_done.load() || uncaptured_runs.load() < 50) {
      const at::Tensor out = model.forward(expected.inputs()).toTensor();
      if (!at::equal(out, reference)) ++mismatches;
      ++uncaptured_runs;
    }
  });
  std::vector<std::vector<std::string>> captured;
  for (int i = 0; i < 20; ++i) {
    absl::StatusOr<Trace> trace = TraceModule(model, expected.inputs());
    ASSERT_TRUE(trace.ok()) << trace.status();
    captured.push_back(Labels(*trace));
    EXPECT_TRUE(at::equal(trace->Find("output_1").value()->out, reference));
  }
  capturing_done = true;
  uncaptured.join();
  EXPECT_EQ(mismatches.load(), 0);
  for (const std::vector<std::string>& labels : captured) EXPECT_EQ(labels, Labels(*single));
}

TEST(ThreadsTest, TwoThreadsCaptureDifferentModelsAtOnce) {
  const std::vector<std::string> names = {"mlp", "seed_recurrent"};
  std::vector<std::vector<std::string>> references;
  for (const std::string& name : names) {
    torch::jit::Module model = testdata::LoadModel(name);
    absl::StatusOr<Trace> trace = TraceModule(model, testdata::Expected(name).inputs());
    ASSERT_TRUE(trace.ok()) << trace.status();
    references.push_back(Labels(*trace));
  }
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (size_t t = 0; t < names.size(); ++t) {
    threads.emplace_back([&, t] {
      testdata::Expected expected(names[t]);
      for (int i = 0; i < 20; ++i) {
        // A fresh model each time: seed_recurrent's forward changes its buffer.
        torch::jit::Module model = testdata::LoadModel(names[t]);
        absl::StatusOr<Trace> trace = TraceModule(model, expected.inputs());
        if (!trace.ok() || Labels(*trace) != references[t] ||
            !at::allclose(trace->Find("output_1").value()->out, expected.output(0))) {
          ++failures;
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
}

}  // namespace
}  // namespace torchlens
