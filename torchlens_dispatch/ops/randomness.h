// Which operators consume randomness, for capture (which saves the generator state before
// them) and replay (which restores it).
#ifndef TORCHLENS_DISPATCH_OPS_RANDOMNESS_H_
#define TORCHLENS_DISPATCH_OPS_RANDOMNESS_H_

#include <ATen/core/dispatch/Dispatcher.h>

namespace torchlens {

// Whether the operator draws from a generator: tagged `nondeterministic_seeded` (dropout,
// rand*, bernoulli_), taking a `Generator` argument, or taking a dropout probability
// (`DrawsOnlyForDropout`).
bool ConsumesRandomness(const c10::OperatorHandle& op);

// Whether the operator draws only through a dropout probability argument that its schema
// does not tag: the fused recurrent layers (`aten::lstm`, `aten::gru`, `aten::rnn_tanh`,
// `aten::rnn_relu`, whose `float dropout` applies between layers in training) and
// attention (`dropout_p`). They draw only when training with a nonzero probability, so a
// trace written before torchlens saved a generator state for them replays them without
// one.
bool DrawsOnlyForDropout(const c10::OperatorHandle& op);

}  // namespace torchlens

#endif  // TORCHLENS_DISPATCH_OPS_RANDOMNESS_H_
