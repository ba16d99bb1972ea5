#include "tools/nested_modules.h"

#include "absl/strings/str_cat.h"

namespace torchlens {

torch::jit::Module NestedModules(int depth, const at::Tensor& weight) {
  torch::jit::Module module("Leaf");
  module.register_parameter("weight", weight, false);
  module.define("def forward(self, x):\n  return torch.mm(x, self.weight)\n");
  for (int level = 0; level < depth; ++level) {
    torch::jit::Module wrap(absl::StrCat("Wrap", level));
    wrap.register_module("inner", module);
    wrap.define("def forward(self, x):\n  return torch.relu(self.inner.forward(x))\n");
    module = wrap;
  }
  return module;
}

}  // namespace torchlens
