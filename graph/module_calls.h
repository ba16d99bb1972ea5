// A module's calls in a trace: which ops each call ran and which of them it returned.
//
//   absl::StatusOr<std::vector<torchlens::ModuleCall>> calls =
//       torchlens::ModuleCalls(*trace, "layer1.0");
//   for (const torchlens::ModuleCall& call : *calls) {
//     for (int output : call.outputs) std::cout << trace->ops()[output].label << "\n";
//   }
//
// NOTE [Module calls]
// A trace records the module that ran each op, not when a module's forward began, so the
// calls are read back from the ops: the ops of a module (its submodules' included) run
// without interruption during one call, and a call that follows another at once starts
// over the module's code, repeating the layer that began the previous one (pass 2, 3...).
// A module whose forward begins inside a loop over its own first statement therefore shows
// each iteration as a call. Buffer versions, inputs, outputs and constants are not ops of
// any call: a call's ops are the compute ops attributed to it.
#ifndef TORCHLENS_GRAPH_MODULE_CALLS_H_
#define TORCHLENS_GRAPH_MODULE_CALLS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "graph/trace.h"

namespace torchlens {

struct ModuleCall {
  std::string address;  // "" is the root
  int call = 1;         // 1-based, in execution order
  // Positions in `Trace::ops()`, in execution order: every op the call ran, and those whose
  // value left it (read by a node outside the call, directly or through a buffer version
  // it wrote, or returned as a model output). Ops whose value nothing read are not
  // outputs.
  std::vector<int> ops;
  std::vector<int> outputs;
};

// The calls of the module at `address` (as `named_modules()` names it), in execution
// order; empty when it never ran. kNotFound, naming the closest addresses, when the trace
// has no such module.
absl::StatusOr<std::vector<ModuleCall>> ModuleCalls(const Trace& trace, absl::string_view address);

// Each call's output ops: TorchLens's `model_history["fc1"]` (the module's output layer)
// with one entry per pass.
absl::StatusOr<std::vector<std::vector<const Op*>>> FindModuleOutputs(const Trace& trace,
                                                                      absl::string_view address);

// "Module layer1.0 (BasicBlock): 1 call\n  call 1: 7 ops (conv2d_1_1:1 .. relu_2_7:1),
// outputs relu_2_7:1\n", or the error of ModuleCalls: the command-line tool's --module.
absl::StatusOr<std::string> DescribeModuleCalls(const Trace& trace, absl::string_view address);

// Whether `module` (a module address) is `address` or inside it.
bool IsWithinModule(absl::string_view module, absl::string_view address);

}  // namespace torchlens

#endif  // TORCHLENS_GRAPH_MODULE_CALLS_H_
