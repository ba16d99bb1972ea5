#include "tools/serve/service.h"

#include <torch/torch.h>

#include <atomic>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "graph/render.h"
#include "graph/trace_file.h"
#include "torchlens_dispatch/capture.h"

namespace torchlens {
namespace serve {

Service::Service(torch::jit::Module model, ServiceOptions options)
    : model_(std::move(model)), options_(std::move(options)) {}

std::vector<Answer> Service::Serve(const std::vector<Request>& requests) {
  std::vector<Answer> answers(requests.size());
  std::atomic<size_t> next{0};
  std::vector<std::thread> workers;
  for (int w = 0; w < std::max(options_.workers, 1); ++w) {
    workers.emplace_back([&] {
      for (size_t i = next++; i < requests.size(); i = next++) answers[i] = Handle(requests[i]);
    });
  }
  for (std::thread& worker : workers) worker.join();
  return answers;
}

Answer Service::Handle(const Request& request) {
  torch::NoGradGuard no_grad;
  Answer answer;
  answer.id = request.id;
  try {
    if (!request.capture) {
      answer.output = model_.forward({request.input}).toTensor();
      return answer;
    }
    // Only this request, on this worker thread, is captured.
    CaptureGuard guard(model_);
    guard.MarkInputs(request.input);
    const c10::IValue out = model_.forward({request.input});
    answer.output = out.toTensor();
    absl::StatusOr<Trace> trace = guard.Finish(out);
    if (!trace.ok()) {
      answer.status = trace.status();
      return answer;  // the answer stands; only the trace is missing
    }
    answer.captured_ops = static_cast<int>(trace->capture_stats().user_ops);
    answer.trace_file = absl::StrCat(options_.out_dir, "/request_", request.id, ".trace.pt");
    answer.graph_file = absl::StrCat(options_.out_dir, "/request_", request.id, ".svg");
    answer.status = SaveTrace(*trace, answer.trace_file);
    if (answer.status.ok()) answer.status = RenderToFile(*trace, answer.graph_file);
  } catch (const std::exception& e) {
    answer.status =
        absl::InvalidArgumentError(absl::StrCat("request ", request.id, ": ", e.what()));
  }
  return answer;
}

}  // namespace serve
}  // namespace torchlens
