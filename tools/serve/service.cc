#include "tools/serve/service.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/render.h"
#include "graph/trace_file.h"
#include "torchlens_dispatch/capture.h"
#include "torchlens_dispatch/ops/exception_text.h"

namespace torchlens {
namespace serve {

Service::Service(torch::jit::Module model, ServiceOptions options)
    : model_(std::move(model)), options_(std::move(options)), writer_([this] { WriteLoop(); }) {}

Service::~Service() {
  (void)Flush();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  writer_.join();
}

std::vector<Answer> Service::Serve(const std::vector<Request>& requests) {
  std::vector<Answer> answers(requests.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < requests.size(); i = next++) answers[i] = Handle(requests[i]);
  };
  std::vector<std::thread> workers;
  try {
    for (int w = 0; w < std::max(options_.workers, 1); ++w) workers.emplace_back(work);
  } catch (const std::system_error&) {
    // No more threads (the process's limit): the ones running share the requests, and with
    // none this thread answers them. Unwinding past joinable threads would terminate.
  }
  if (workers.empty()) work();
  for (std::thread& worker : workers) worker.join();
  (void)Flush();
  std::lock_guard<std::mutex> lock(mutex_);
  for (Answer& answer : answers) {
    auto failed = failed_writes_.find(answer.trace_file);
    if (!answer.trace_file.empty() && failed != failed_writes_.end())
      answer.status = failed->second;
  }
  failed_writes_.clear();
  return answers;
}

bool Service::Sampled(const Request& request) {
  const uint64_t arrival = arrivals_.fetch_add(1, std::memory_order_relaxed);
  return request.capture || (options_.capture_one_in > 0 && arrival % options_.capture_one_in == 0);
}

Answer Service::Handle(const Request& request) {
  torch::NoGradGuard no_grad;
  Answer answer;
  answer.id = request.id;
  try {
    if (!Sampled(request)) {
      answer.output = model_.forward({request.input}).toTensor();
      return answer;
    }
    FreeWrittenTraces();
    // Only this request, on this thread, is captured.
    CaptureOptions capture;
    capture.max_saved_bytes = options_.max_trace_bytes;
    capture.partial_on_budget = true;
    CaptureGuard guard(model_, capture);
    guard.MarkInputs(request.input);
    const c10::IValue out = model_.forward({request.input});
    answer.output = out.toTensor();
    absl::StatusOr<Trace> trace = guard.Finish(out);
    if (!trace.ok()) {
      answer.status = trace.status();
      return answer;  // the answer stands; only the trace is missing
    }
    answer.captured_ops = static_cast<int>(trace->capture_stats().user_ops);
    answer.partial = trace->partial();
    answer.trace_file = absl::StrCat(options_.out_dir, "/request_", request.id, ".trace.pt");
    if (options_.render_graphs) {
      answer.graph_file = absl::StrCat(options_.out_dir, "/request_", request.id, ".svg");
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(
          {*std::move(trace), answer.trace_file, answer.graph_file, std::this_thread::get_id()});
    }
    changed_.notify_all();
  } catch (const std::exception& e) {
    answer.status =
        absl::InvalidArgumentError(absl::StrCat("request ", request.id, ": ", MessageOf(e)));
  }
  return answer;
}

absl::Status Service::Flush() {
  std::vector<PendingTrace> written;
  absl::Status status;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return queue_.empty() && !writing_; });
    status = std::exchange(write_error_, absl::OkStatus());
    written.swap(to_free_);
  }
  return status;  // `written` is freed here, by the caller
}

// NOTE [Traces freed where they were made]
// A trace's memory comes from the capturing thread's malloc arena. Freed by the writer
// thread, each of its thousands of blocks took that arena's lock while the request thread
// allocated from it for its next, uncaptured requests, which raised their tail latency
// (tools/BENCH_RESULTS.md). The writer therefore hands each written
// trace back, and the thread that captured it frees it at its next capture, a request
// that pays for capturing anyway (or Flush frees what is left).
void Service::FreeWrittenTraces() {
  std::vector<PendingTrace> mine;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (to_free_.empty()) return;
    const std::thread::id self = std::this_thread::get_id();
    size_t kept = 0;
    for (PendingTrace& pending : to_free_) {
      if (pending.captured_on == self) {
        mine.push_back(std::move(pending));
      } else {
        to_free_[kept++] = std::move(pending);
      }
    }
    to_free_.resize(kept);
  }
}

void Service::WriteLoop() {
  // The lowest CPU priority (Linux applies nice per thread): request threads preempt the
  // writer, so writing a trace delays no request; the writer uses idle time.
  (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), 19);
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    changed_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, nothing left
    PendingTrace pending = std::move(queue_.front());
    queue_.pop_front();
    writing_ = true;
    lock.unlock();
    absl::Status status = SaveTrace(pending.trace, pending.trace_file);
    if (status.ok() && !pending.graph_file.empty()) {
      status = RenderToFile(pending.trace, pending.graph_file);
    }
    std::vector<std::string> files = {std::move(pending.trace_file)};
    if (!pending.graph_file.empty()) files.push_back(std::move(pending.graph_file));
    lock.lock();
    to_free_.push_back(std::move(pending));  // NOTE [Traces freed where they were made]
    if (!status.ok()) {
      if (write_error_.ok()) write_error_ = status;
      failed_writes_[files.front()] = status;
    }
    written_.push_back(std::move(files));
    while (options_.max_traces_kept > 0 &&
           written_.size() > static_cast<size_t>(options_.max_traces_kept)) {
      for (const std::string& file : written_.front()) std::remove(file.c_str());
      written_.pop_front();
    }
    writing_ = false;
    changed_.notify_all();
  }
}

}  // namespace serve
}  // namespace torchlens
