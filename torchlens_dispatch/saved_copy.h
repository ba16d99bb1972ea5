// The private copy a saved value gets before the model overwrites it (NOTE [Copy-on-write
// of saved values] in recorder.h).
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
// statistics, a recurrent state). Everything else is cloned.
#ifndef TORCHLENS_DISPATCH_SAVED_COPY_H_
#define TORCHLENS_DISPATCH_SAVED_COPY_H_

#include <ATen/core/Tensor.h>

namespace torchlens {

// A tensor equal to `saved` (same sizes, strides when contiguous, dtype and device) that
// shares no memory with it, as `saved.clone()` gives. It requires grad only when `saved`
// does and is not contiguous (clone); callers copying a value that may require grad detach
// it first.
at::Tensor CopyOfSaved(const at::Tensor& saved);

}  // namespace torchlens

#endif  // TORCHLENS_DISPATCH_SAVED_COPY_H_
