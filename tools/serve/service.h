// A small inference service that captures the requests it is asked to, on their own
// worker thread, while other requests run untouched (tools/serve_example runs it).
//
//   torchlens::serve::Service service(model, {.workers = 4, .out_dir = "/tmp/traces"});
//   std::vector<Answer> answers = service.Serve(requests);
//
// A request marked `capture` runs inside a CaptureGuard on the worker that takes it; the
// worker writes request_<id>.trace.pt (SaveTrace) and request_<id>.svg (RenderToFile) and
// answers normally. Unmarked requests pay nothing: the capture key is thread-local.
#ifndef TORCHLENS_TOOLS_SERVE_SERVICE_H_
#define TORCHLENS_TOOLS_SERVE_SERVICE_H_

#include <ATen/core/Tensor.h>
#include <torch/script.h>

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace torchlens {
namespace serve {

struct Request {
  int id = 0;
  at::Tensor input;
  bool capture = false;
};

struct Answer {
  int id = 0;
  at::Tensor output;
  absl::Status status;     // the forward's, or the capture's when captured
  std::string trace_file;  // set for captured requests
  std::string graph_file;
  int captured_ops = 0;
};

struct ServiceOptions {
  int workers = 4;
  std::string out_dir;  // where captured requests' files go
};

class Service {
 public:
  // `model` is shared by all workers (TorchScript modules are safe to run concurrently).
  Service(torch::jit::Module model, ServiceOptions options);
  // Answers every request, in request order.
  std::vector<Answer> Serve(const std::vector<Request>& requests);

 private:
  Answer Handle(const Request& request);

  torch::jit::Module model_;
  ServiceOptions options_;
};

}  // namespace serve
}  // namespace torchlens

#endif  // TORCHLENS_TOOLS_SERVE_SERVICE_H_
