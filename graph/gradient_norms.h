// Gradient norms of a trace captured with CaptureOptions::save_grads (NOTE [Gradients in a
// trace] in graph/gradients.h): per value, and per module over its parameters, as the
// summary and the JSON report them.
//
//   for (const auto& [module, norm] : torchlens::ModuleGradNorms(*trace)) {
//     std::cout << (module.empty() ? "(model)" : module) << " " << norm << "\n";
//   }
#ifndef TORCHLENS_GRAPH_GRADIENT_NORMS_H_
#define TORCHLENS_GRAPH_GRADIENT_NORMS_H_

#include <ATen/core/Tensor.h>

#include <map>
#include <optional>
#include <string>

#include "graph/trace.h"

namespace torchlens {

// The L2 norm of `grad` (over every element; the magnitudes of complex ones), NaN when it
// holds NaN; nullopt when it is undefined.
std::optional<double> GradNorm(const at::Tensor& grad);

// Per module address ("" the model itself), the L2 norm of the gradients of every
// parameter it owns, its submodules' included (Module::params), over those the backward
// reached; modules none of whose parameters got a gradient are left out.
std::map<std::string, double> ModuleGradNorms(const Trace& trace);

}  // namespace torchlens

#endif  // TORCHLENS_GRAPH_GRADIENT_NORMS_H_
