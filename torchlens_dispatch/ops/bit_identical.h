// The one definition of "the same value" in torchlens.
//
// NOTE [Bitwise equality]
// Capture, validation and interventions all ask whether two tensors hold the same value:
// did a fused kernel change a running statistic, does a replay reproduce a saved output,
// does a recomputed buffer version certify. They must give one answer, and the answer is
// bitwise: same shape, same dtype, and the same bytes in each element. NaN equals a NaN
// with the same payload (a buffer holding NaN does not change by being compared), and
// -0.0 differs from 0.0 (a kernel that flips the sign of a zero changed the value).
// `at::equal` is neither (NaN != NaN, -0.0 == 0.0) and is never used for this.
#ifndef TORCHLENS_DISPATCH_OPS_BIT_IDENTICAL_H_
#define TORCHLENS_DISPATCH_OPS_BIT_IDENTICAL_H_

#include <ATen/core/Tensor.h>

namespace torchlens {

// Whether `a` and `b` are both undefined, or hold the same bits in the same shape, dtype
// and layout (strides may differ). Quantized tensors also compare scale and zero point,
// sparse tensors their coalesced indices and values; tensors without data (meta) compare
// their metadata only. Never throws for a defined pair of any layout.
bool BitIdentical(const at::Tensor& a, const at::Tensor& b);

}  // namespace torchlens

#endif  // TORCHLENS_DISPATCH_OPS_BIT_IDENTICAL_H_
