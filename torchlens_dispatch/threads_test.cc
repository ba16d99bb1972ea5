// Capture is per thread: other threads run untouched, and concurrent captures of
// different models produce complete, independent traces.
#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testdata/testdata.h"
#include "testdata/trace_testing.h"
#include "torchlens_dispatch/capture.h"
#include "torchlens_dispatch/ops/capture_key.h"
#include "validation/validate.h"

namespace torchlens {
namespace {

using ::torchlens::testing_util::Labels;

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

namespace torchlens {
namespace {

// 8 threads run inference on one shared TorchScript model; 2 of them capture repeatedly.
// Every uncaptured output equals the reference, every trace is complete and validates,
// and nothing leaks across threads (an uncaptured thread never sees the capture key).
TEST(ThreadsTest, StressEightThreadsTwoCapturing) {
  // An inference model that writes no state (demo.pt counts its calls in a buffer, which
  // concurrent forwards race on: captures rightly report that as an unjournaled change).
  torch::jit::Module model = testdata::LoadModel("convbn_eval");
  testdata::Expected expected("convbn_eval");
  const at::Tensor reference = RunReference(model, expected);
  absl::StatusOr<Trace> single = TraceModule(model, expected.inputs());
  ASSERT_TRUE(single.ok()) << single.status();
  const std::vector<std::string> labels = Labels(*single);

  constexpr int kThreads = 8;
  constexpr int kIterations = 12;
  std::atomic<int> wrong_outputs{0};
  std::atomic<int> bad_traces{0};
  std::atomic<int> leaked_key{0};
  std::atomic<int> traces{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      torch::NoGradGuard no_grad;  // how services run inference
      const bool capturing = t < 2;
      for (int i = 0; i < kIterations; ++i) {
        if (capturing) {
          absl::StatusOr<Trace> trace = TraceModule(model, expected.inputs());
          if (!trace.ok() || Labels(*trace) != labels ||
              !at::equal(trace->Find("output_1").value()->out, reference)) {
            ++bad_traces;
            continue;
          }
          absl::StatusOr<ValidationReport> report = ValidateForwardPass(*trace);
          if (!report.ok() || !report->passed) ++bad_traces;
          ++traces;
        } else {
          if (c10::impl::tls_is_dispatch_key_included(kCaptureKey)) ++leaked_key;
          torch::jit::GraphOptimizerEnabledGuard same_settings(false);
          const at::Tensor out = model.forward(expected.inputs()).toTensor();
          if (!at::equal(out, reference)) ++wrong_outputs;
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(wrong_outputs.load(), 0);
  EXPECT_EQ(bad_traces.load(), 0);
  EXPECT_EQ(leaked_key.load(), 0);
  EXPECT_EQ(traces.load(), 2 * kIterations);
}

// The first searches of a trace build its label index (NOTE [Lazy label index]); threads
// that search it at once all see the whole index.
TEST(ThreadsTest, ThreadsSearchingAFreshTraceAtOnceAllFindEveryOp) {
  torch::jit::Module model = testdata::LoadModel("convbn_eval");
  testdata::Expected expected("convbn_eval");
  for (int round = 0; round < 20; ++round) {
    absl::StatusOr<Trace> trace = TraceModule(model, expected.inputs());
    ASSERT_TRUE(trace.ok()) << trace.status();
    const std::vector<Op>& ops = trace->ops();
    ASSERT_GT(ops.size(), 3u);
    std::atomic<int> wrong{0};
    std::atomic<bool> go{false};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        while (!go.load()) {
        }
        for (size_t k = 0; k < ops.size(); ++k) {
          const size_t i = (k + static_cast<size_t>(t)) % ops.size();  // different first labels
          absl::StatusOr<const Op*> found = trace->Find(ops[i].label);
          if (!found.ok() || *found != &ops[i]) ++wrong;
        }
      });
    }
    go.store(true);
    for (std::thread& thread : threads) thread.join();
    EXPECT_EQ(wrong.load(), 0) << "round " << round;
  }
}

}  // namespace
}  // namespace torchlens
