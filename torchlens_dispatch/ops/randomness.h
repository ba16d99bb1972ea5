// Which operators consume randomness, for capture (which saves the generator state before
// them) and replay (which restores it).
#ifndef TORCHLENS_DISPATCH_OPS_RANDOMNESS_H_
#define TORCHLENS_DISPATCH_OPS_RANDOMNESS_H_

#include <ATen/core/dispatch/Dispatcher.h>

namespace torchlens {

// Whether the operator draws from a generator: tagged `nondeterministic_seeded` (dropout,
// rand*, bernoulli_) or taking a `Generator` argument.
bool ConsumesRandomness(const c10::OperatorHandle& op);

}  // namespace torchlens

#endif  // TORCHLENS_DISPATCH_OPS_RANDOMNESS_H_
