// What LibTorch's CPU kernels trust about their arguments without checking, checked before
// replay calls them (validation/replay.h).
//
// NOTE [Kernels that trust their arguments]
// Replay calls the operator an op names with the arguments its trace holds. A trace from a
// capture holds what the model passed, which the kernel was fine with; a trace file holds
// whatever the file says. Most kernels check what they index with (`index_select`,
// `gather`, `embedding`: a c10::Error, which replay reports), but some trust their
// arguments and read or write outside their tensors when those lie (LibTorch 1.13's
// sources): `as_strided`'s bounds check multiplies the offset
// by the element size and wraps near 2^62; `embedding_bag` with `include_last_offset`
// writes past its output when the last offset is short; `ctc_loss` reads `log_probs` at
// unchecked targets; `searchsorted` at unchecked `sorter` entries; `repeat_interleave`
// with `output_size` writes negative repeats past it; `bincount` overflows its bin count
// at 2^63 - 1; `_pad_packed_sequence` walks its `batch_sizes` below its buffer;
// `native_batch_norm` loops over the input's channels in parameters of any size;
// `multilabel_margin_loss` writes at its targets. Those arguments are checked here. The
// kernels no forward pass calls by name (backward kernels, `_sparse_*_unsafe`
// constructors, `_sobol_engine_*`, `_reshape_alias`, `segment_reduce`,
// `native_channel_shuffle`, `from_file`, ...) are not replayed at all. A refused call is
// kFailedPrecondition ("not replayable"): validation lists the op as unproved, never as
// failed.
#ifndef TORCHLENS_VALIDATION_KERNEL_PRECONDITIONS_H_
#define TORCHLENS_VALIDATION_KERNEL_PRECONDITIONS_H_

#include <ATen/core/ivalue.h>
#include <ATen/core/operator_name.h>

#include "absl/status/status.h"

namespace torchlens {

// OK when calling operator `name` on `args` (its schema's arguments, in order) stays inside
// the tensors it is given, as far as LibTorch's kernel does not check it itself;
// kFailedPrecondition naming the argument otherwise.
absl::Status CheckKernelPreconditions(const c10::OperatorName& name,
                                      c10::ArrayRef<c10::IValue> args);

// Whether `status` is (or carries) such a refusal, which validation reports as unproved.
bool IsKernelPreconditionRefusal(const absl::Status& status);
// `status` marked as carrying one.
absl::Status MarkKernelPreconditionRefusal(absl::Status status);

}  // namespace torchlens

#endif  // TORCHLENS_VALIDATION_KERNEL_PRECONDITIONS_H_
