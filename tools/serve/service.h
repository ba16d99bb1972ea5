// A small inference service that captures some of its requests, on their own worker
// thread, while other requests run untouched (tools/serve_example runs it, and
// tools/serve/load_generator measures what sampling costs the requests it does not
// capture).
//
//   torchlens::serve::Service service(model, {.workers = 4, .out_dir = "/tmp/traces"});
//   std::vector<Answer> answers = service.Serve(requests);
//
// A request is captured when it is marked `capture`, or when sampling picks it (one
// request in `capture_one_in`, counted in arrival order). It runs inside a CaptureGuard
// on the thread that handles it and answers normally; its trace goes to a writer thread,
// which writes request_<id>.trace.pt (SaveTrace) and, with `render_graphs`,
// request_<id>.svg, off the request's thread and at the lowest CPU priority. The writer keeps at
// most `max_traces_kept` traces in `out_dir`, removing the oldest it wrote. Uncaptured requests pay
// nothing but one atomic increment: the capture key is thread-local.
#ifndef TORCHLENS_TOOLS_SERVE_SERVICE_H_
#define TORCHLENS_TOOLS_SERVE_SERVICE_H_

#include <ATen/core/Tensor.h>
#include <torch/script.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "graph/trace.h"

namespace torchlens {
namespace serve {

struct Request {
  int id = 0;
  at::Tensor input;
  bool capture = false;  // capture it whatever the sampling says
};

struct Answer {
  int id = 0;
  at::Tensor output;
  absl::Status status;     // the forward's, or the capture's when captured
  std::string trace_file;  // set for captured requests (written by the writer thread)
  std::string graph_file;  // set when graphs are rendered
  int captured_ops = 0;
  bool partial = false;  // the trace stopped saving at max_trace_bytes
};

struct ServiceOptions {
  int workers = 4;
  std::string out_dir;           // where captured requests' files go
  int capture_one_in = 0;        // sample one request in N (0: only marked requests)
  int max_traces_kept = 0;       // traces kept in out_dir, oldest removed (0: all)
  int64_t max_trace_bytes = -1;  // saved bytes per trace (CaptureOptions::max_saved_bytes)
  bool render_graphs = true;     // also write request_<id>.svg
};

class Service {
 public:
  // `model` is shared by all threads (TorchScript modules are safe to run concurrently).
  Service(torch::jit::Module model, ServiceOptions options);
  ~Service();  // writes the traces still queued
  Service(const Service&) = delete;
  Service& operator=(const Service&) = delete;

  // Answers every request, in request order, on `workers` threads; returns once their
  // traces are written (a captured answer's status is then the write's when it failed).
  std::vector<Answer> Serve(const std::vector<Request>& requests);
  // Answers one request on the calling thread (any number of threads at once). Its trace,
  // if captured, is queued for the writer: call Flush before reading it.
  Answer Handle(const Request& request);
  // Waits until every queued trace is written, and frees the written traces their
  // capturing threads have not freed yet (NOTE [Traces freed where they were made] in
  // service.cc); the first write error since the last Flush, if any.
  absl::Status Flush();

 private:
  struct PendingTrace {
    Trace trace;
    std::string trace_file;
    std::string graph_file;
    std::thread::id captured_on;
  };
  bool Sampled(const Request& request);
  void WriteLoop();
  // Destroys the written traces this thread captured (NOTE [Traces freed where they were
  // made] in service.cc).
  void FreeWrittenTraces();

  torch::jit::Module model_;
  ServiceOptions options_;
  std::atomic<uint64_t> arrivals_{0};

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<PendingTrace> queue_;
  bool writing_ = false;  // the writer holds a trace taken off the queue
  bool stopping_ = false;
  absl::Status write_error_;
  absl::flat_hash_map<std::string, absl::Status> failed_writes_;  // by trace file, for Serve
  std::deque<std::vector<std::string>> written_;  // each kept trace's files, oldest first
  std::vector<PendingTrace> to_free_;  // written, waiting for the thread that captured them
  std::thread writer_;                 // last: started once the rest is ready
};

}  // namespace serve
}  // namespace torchlens

#endif  // TORCHLENS_TOOLS_SERVE_SERVICE_H_
