#include "tools/bench_backward.h"

#include <torch/torch.h>

#include <algorithm>
#include <functional>
#include <iostream>

#include "tools/bench_timing.h"
#include "torchlens_dispatch/capture.h"
#include "torchlens_dispatch/ops/ivalue_tensors.h"
#include "torchlens_dispatch/script_runner.h"
#include "validation/validate.h"

namespace torchlens {
namespace {

// backward() of the sum of every output that requires grad, as the CLI's --backward.
void Backward(const c10::IValue& outputs) {
  at::Tensor loss;
  ForEachTensor(outputs, [&](const at::Tensor& t) {
    if (!t.defined() || !t.requires_grad()) return;
    loss = loss.defined() ? loss + t.sum() : t.sum();
  });
  if (loss.defined()) loss.backward();
}

struct Row {
  std::string name;
  std::function<void()> run;
  std::vector<double> micros;
};

}  // namespace

nlohmann::json BenchBackward(const std::string& name, torch::jit::Module& model,
                             const std::vector<c10::IValue>& inputs, int repeats,
                             const std::vector<std::string>& configs) {
  c10::AutoGradMode with_grad(true);
  CaptureOptions grads;
  grads.save_grads = true;
  CaptureOptions grads_unsaved = grads;
  grads_unsaved.save_activations = false;
  auto captured = [&](const CaptureOptions& options) {
    c10::IValue outputs;
    absl::StatusOr<Trace> trace = TraceModule(model, inputs, options, &outputs);
    if (trace.ok()) Backward(outputs);
    return trace;
  };
  for (const torch::jit::NameTensor& buffer : model.named_buffers()) {
    if (buffer.value.requires_grad()) buffer.value.detach_();
  }
  absl::StatusOr<Trace> reference = captured(grads);
  if (!reference.ok()) {
    std::cerr << name << ": " << reference.status() << "\n";
    return nullptr;
  }
  bool validated = false;
  int checked = 0;
  std::vector<Row> rows = {
      {"fwd_bwd", [&] { Backward(model.forward(inputs)); }},
      {"fwd_bwd_private_plan", [&] { Backward(RunUnoptimized(model, inputs)); }},
      {"capture_fwd_bwd", [&] { (void)captured(CaptureOptions()); }},
      {"capture_grads_fwd_bwd", [&] { (void)captured(grads); }},
      {"capture_grads_unsaved", [&] { (void)captured(grads_unsaved); }},
      {"validate_grads",
       [&] {
         absl::StatusOr<ValidationReport> report = ValidateGradients(*reference);
         validated = report.ok() && report->passed;
         checked = report.ok() ? report->ops_checked : 0;
         if (report.ok() && !report->passed) {
           for (const std::string& failure : report->failures) std::cerr << failure << "\n";
         }
       }},
  };
  if (!configs.empty()) {
    rows.erase(std::remove_if(rows.begin() + 1, rows.end(),
                              [&](const Row& row) {
                                return std::find(configs.begin(), configs.end(), row.name) ==
                                       configs.end();
                              }),
               rows.end());
  }
  const std::vector<at::Tensor> params = [&] {
    std::vector<at::Tensor> all;
    for (const at::Tensor& p : model.parameters()) all.push_back(p);
    return all;
  }();
  // And a state buffer the last run left attached to its graph (recurrent100's `h`) starts
  // the next run detached, as truncated backpropagation through time does.
  auto zero_grads = [&] {
    for (const at::Tensor& p : params) p.mutable_grad() = at::Tensor();
    for (const torch::jit::NameTensor& buffer : model.named_buffers()) {
      if (buffer.value.requires_grad()) buffer.value.detach_();
    }
  };
  for (int warm = 0; warm < 3; ++warm) {
    for (Row& row : rows) {
      zero_grads();
      row.run();
    }
  }
  if (repeats == 0) {
    zero_grads();
    const double plain = MicrosOf(rows[0].run) / 1e6;  // seconds
    repeats = static_cast<int>(std::clamp(6.0 / (plain * 6 + 1e-9), 9.0, 301.0));
  }
  for (int r = 0; r < repeats; ++r) {
    for (Row& row : rows) {
      zero_grads();
      row.micros.push_back(MicrosOf(row.run));
    }
  }
  const double plain = Median(rows[0].micros);
  nlohmann::json result = nlohmann::json::array();
  for (const Row& row : rows) {
    const double median = Median(row.micros);
    nlohmann::json json = {{"model", name},
                           {"config", row.name},
                           {"median_us", median},
                           {"ratio", median / plain},
                           {"recorded_ops", reference->capture_stats().user_ops},
                           {"repeats", repeats}};
    if (row.name == "validate_grads") {
      json["passed"] = validated;
      json["gradients_checked"] = checked;
    }
    result.push_back(json);
  }
  return result;
}

}  // namespace torchlens
