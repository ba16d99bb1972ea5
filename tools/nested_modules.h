// A TorchScript model `depth` modules deep, each of its own class wrapping the next, with
// x @ weight innermost: the structure torch.jit.script gives Python's nested modules. The
// deep-nesting bench and the deep-model test load what it saves.
#ifndef TORCHLENS_TOOLS_NESTED_MODULES_H_
#define TORCHLENS_TOOLS_NESTED_MODULES_H_

#include <ATen/ATen.h>
#include <torch/script.h>

namespace torchlens {

// Wrap{depth-1}(... Wrap0(Leaf) ...): each Wrap returns relu(inner(x)), Leaf x @ weight.
torch::jit::Module NestedModules(int depth, const at::Tensor& weight);

}  // namespace torchlens

#endif  // TORCHLENS_TOOLS_NESTED_MODULES_H_
