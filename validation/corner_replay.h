// Proving an edge of a windowed op on the corner of its input that its first output
// position reads, instead of on the whole input.
//
// NOTE [Perturbing a corner]
// Validation proves an edge by perturbing the parent and seeing the op's output change
// (NOTE [Perturbations that can prove] in values.h): one more run of the op per parent.
// For a convolution or a max pooling that run costs as much as the op, and in a CNN these
// ops are most of the forward, so the perturbed runs alone cost about a plain forward. But the
// first output position of the first sample of such an op reads only a corner of the input: that
// sample's elements [0, e) along each spatial dimension, e = dilation * (kernel - 1) - padding + 1
// (the window at position 0 starts `padding` before the first element). The same op, every other
// argument as it is, computes that position from the corner alone as it does from the whole input;
// so if perturbing the corner changes what the op gives there, the op's output depends on its
// input. Validation runs the op once on a batch of two samples, the corner as saved and the corner
// perturbed, and compares the two samples of the result. Both go through the same kernel in the
// same call: two calls on a lone small corner would be slower than the whole op, as LibTorch 1.13
// runs a convolution of one sample smaller than 20,481 elements with its unoptimized kernel (and
// the corner's result cannot be compared with the saved output: another kernel rounds differently).
// When the two samples agree, or the call fails, the whole input is perturbed as before, so the
// edges proved are the same and the unproved ones are found by the same runs; an edge the corner
// proves costs a fraction of the op. The replay that checks the op's value always runs on the whole
// saved input.
#ifndef TORCHLENS_VALIDATION_CORNER_REPLAY_H_
#define TORCHLENS_VALIDATION_CORNER_REPLAY_H_

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/functional/function_ref.h"
#include "graph/trace.h"

namespace torchlens {

// The corner of a windowed op's input that the first output position of its first sample
// reads.
struct Corner {
  int input = -1;  // index of the windowed input (ForEachTensor order over creation_args)
  // Elements kept along each of the input's spatial (trailing) dimensions, in order.
  absl::InlinedVector<int64_t, 3> extent;
};

// The corner of `op`'s input, when `op` is a convolution (aten::conv1d/2d/3d with
// numeric padding, aten::convolution or aten::_convolution, not transposed) or a max
// pooling (aten::max_pool1d/2d/3d) of a batched, strided, floating-point input, and two
// corners hold at most a quarter of the input's elements; nullopt otherwise.
std::optional<Corner> FindCorner(const Op& op);

// `op`'s saved arguments (as ReplayArguments builds them) with its windowed input replaced
// by the corner pair: a batch of two samples, the first the corner of the input's first
// sample, the second `perturb` of it. nullopt when the tensors a parent perturbs,
// `perturbed` (as PerturbedTensorsByParent gives them), are not the windowed input alone,
// or when `perturb` gives nullopt.
std::optional<std::vector<c10::IValue>> CornerPairArguments(
    const Op& op, const Corner& corner, const std::vector<int>& perturbed,
    absl::FunctionRef<std::optional<at::Tensor>(const at::Tensor& corner)> perturb);

// Whether the two samples of some output of a run on the corner pair differ at the first
// output position (the other positions of the corner's output read elements the corner
// left out as padding, so they are not the whole op's).
bool PairSamplesDiffer(const Corner& corner, const std::vector<at::Tensor>& outputs);

}  // namespace torchlens

#endif  // TORCHLENS_VALIDATION_CORNER_REPLAY_H_
