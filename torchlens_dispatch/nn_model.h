// Reading a torch::nn (C++ frontend) module's registered state (see model_state.h).
#ifndef TORCHLENS_DISPATCH_NN_MODEL_H_
#define TORCHLENS_DISPATCH_NN_MODEL_H_

#include "torchlens_dispatch/model_state.h"

namespace torch {
namespace nn {
class Module;
}  // namespace nn
}  // namespace torch

namespace torchlens {

ModelState ReadModelState(const torch::nn::Module& model);

}  // namespace torchlens

#endif  // TORCHLENS_DISPATCH_NN_MODEL_H_
