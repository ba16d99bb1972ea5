// The private copy a saved value gets before the model overwrites it (NOTE [Copy-on-write
// of saved values] in saved_value_index.h).
//
// NOTE [Streaming copies of saved values]
// Such a copy is written once and read, if ever, long after the capture (validation,
// interventions, export). Copied the usual way, every cache line of the new tensor is
// first read from memory, only to be overwritten, and then evicts some of what the model
// is about to use. Large contiguous CPU tensors are therefore copied with non-temporal
// stores, which write the new lines straight to memory (torchvision's in-place ReLUs and
// residual adds make ResNets copy megabytes of saved values per forward; README
// "Performance" has the measurements). Contiguous CPU tensors under 256 KiB (whose copy
// may well be read soon, from cache) are copied with one memcpy: `clone()` would set up a
// TensorIterator, which costs more than copying a small tensor (a BatchNorm's running
// statistics, a recurrent state). Everything else is cloned, keeping its strides.
//
// NOTE [Saved copies keep their strides]
// A kernel's result can depend on its input's strides: a reduction over a strided slice
// (`self.stats[:, 0]`, `buf[:, ::2].sum(0)`) adds in another order than over a dense copy,
// and the float results differ in the last bits. Validation replays ops on saved values
// and compares bitwise, so a saved copy must keep the layout the op read. `clone()` keeps
// the strides of dense tensors only and makes a slice with gaps contiguous: such a slice is
// copied into a tensor of the same strides instead (its storage spans the gaps, so this is
// done when the span is at most 4 times the elements or 1 MiB; a column of a large matrix
// is still copied dense). A tensor
// whose elements overlap (an expanded one) cannot be written with its own strides and is
// cloned.
#ifndef TORCHLENS_DISPATCH_OPS_SAVED_COPY_H_
#define TORCHLENS_DISPATCH_OPS_SAVED_COPY_H_

#include <ATen/core/Tensor.h>

namespace torchlens {

// A tensor equal to `saved` (same sizes, strides unless elements overlap, dtype and device) that
// shares no memory with it, as `saved.clone()` gives. It requires grad only when `saved`
// does and is not contiguous (clone); callers copying a value that may require grad detach
// it first.
at::Tensor CopyOfSaved(const at::Tensor& saved);

// `tensor.detach()` without a dispatcher call: a new TensorImpl on the same storage, with the
// same geometry and version counter and no autograd metadata, as LibTorch's detach makes
// (a non-differentiable alias, whose metadata cannot be changed). A saved value must not
// hold the user's autograd graph alive, and with autograd on every op's output requires
// grad: the dispatched detach allocated two TensorImpls and cost a capture most of what it
// added per op.
at::Tensor DetachedAlias(const at::Tensor& tensor);

// `tensor.clone()`, except that a slice with gaps keeps its strides (NOTE [Saved copies
// keep their strides]): for a copy a kernel reads right away, as replay's copies of the
// arguments an op writes.
at::Tensor StridedCopy(const at::Tensor& tensor);

}  // namespace torchlens

#endif  // TORCHLENS_DISPATCH_OPS_SAVED_COPY_H_
