// Forward declarations of LibTorch's two module classes, for headers that take a module by
// reference without including torch/script.h or torch/torch.h (each costs a dependent
// translation unit seconds to compile).
#ifndef TORCHLENS_DISPATCH_MODULE_FWD_H_
#define TORCHLENS_DISPATCH_MODULE_FWD_H_

namespace torch {
namespace jit {
struct Module;
}  // namespace jit
namespace nn {
class Module;
}  // namespace nn
}  // namespace torch

#endif  // TORCHLENS_DISPATCH_MODULE_FWD_H_
