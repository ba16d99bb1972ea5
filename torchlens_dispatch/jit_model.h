// Reading a TorchScript module's registered state (see model_state.h).
#ifndef TORCHLENS_DISPATCH_JIT_MODEL_H_
#define TORCHLENS_DISPATCH_JIT_MODEL_H_

#include "torchlens_dispatch/model_state.h"

namespace torch {
namespace jit {
struct Module;
}  // namespace jit
}  // namespace torch

namespace torchlens {

// Also marks the buffers that some method's code may reassign with prim::SetAttr, so
// that the capture watches only those slots op by op (see NOTE [Buffer reassignment]).
ModelState ReadModelState(const torch::jit::Module& model);

}  // namespace torchlens

#endif  // TORCHLENS_DISPATCH_JIT_MODEL_H_
