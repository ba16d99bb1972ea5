#include "graph/gradient_norms.h"

#include <ATen/ATen.h>

#include <cmath>

namespace torchlens {

std::optional<double> GradNorm(const at::Tensor& grad) {
  if (!grad.defined()) return std::nullopt;
  at::Tensor values = grad.is_sparse() ? grad.coalesce().values() : grad;
  if (values.is_complex()) values = values.abs();
  if (values.numel() == 0) return 0.0;
  return values.to(at::kDouble).norm().item<double>();
}

std::map<std::string, double> ModuleGradNorms(const Trace& trace) {
  std::map<std::string, double> norms;
  const std::map<std::string, at::Tensor>& grads = trace.param_grads();
  if (grads.empty()) return norms;
  for (const auto& [address, module] : trace.modules()) {
    double squares = 0.0;
    bool reached = false;
    for (const std::string& param : module.params) {
      auto it = grads.find(param);
      if (it == grads.end()) continue;
      const std::optional<double> norm = GradNorm(it->second);
      if (!norm.has_value()) continue;
      reached = true;
      squares += *norm * *norm;
    }
    if (reached) norms[address] = std::sqrt(squares);
  }
  return norms;
}

}  // namespace torchlens
