// What torchlens' validation knows about operators' arguments: which ones cannot change
// an op's output, and which an op only decides on. validation/perturbation_check.cc asks
// these when it perturbs a parent (README "Validation" lists them). Arguments are named by their
// tensor index: the position among the op's tensor arguments in ForEachTensor order
// (ivalue_tensors.h).
//
// NOTE [Data-dependent exemptions]
// Some arguments cannot change an op's output for the values this pass happened to see.
// They are checked only after every perturbation failed, and exempted only when the saved
// values prove it (TorchLens exempts index arguments and clamp unconditionally):
//   * an index into a source whose elements are all equal selects the same values whatever
//     it holds (detection models index uniform scores);
//   * clamp with min == max returns that value whatever the input, and so does a clamp
//     that moved every element to one bound (for the values a perturbation can reach);
//   * index_put without accumulation whose indices cover every element of the destination
//     overwrites all of it (torchvision's MultiScaleRoIAlign fills a zeros tensor);
//   * where and masked_fill whose condition never selects the argument (a threshold guard
//     that did not fire: `where(|x| > 100, x, 0)` with every |x| below 100) ignore it;
//   * an overwrite through an index or mask (index_put, index_fill, index_copy,
//     masked_scatter, scatter, put) of the value the destination already holds everywhere
//     leaves it as it was wherever the index points (`y[mask] = 0` into zeros);
//   * an operand that absorbs the other (`i * 0`, `i & 0`, `i | -1` on integers, a scalar or
//     a tensor absorbing everywhere) leaves the other nothing to decide;
//   * where's condition when both branches hold the same values, masked_fill's mask when
//     the tensor already holds the fill value everywhere, and heaviside's values when no
//     input element is zero, select nothing that could differ;
//   * torchvision's nms that kept every box returned the boxes in score order, which the
//     boxes did not decide; with at most one box, neither boxes nor scores decide anything
//     (detection heads run it per class, often on one box).
#ifndef TORCHLENS_DISPATCH_OPS_EXEMPTIONS_H_
#define TORCHLENS_DISPATCH_OPS_EXEMPTIONS_H_

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <vector>

#include "absl/strings/string_view.h"

namespace torchlens {

// Whether tensor argument `tensor_index` of operator `op` ("aten::zeros_like", overload
// `overload`: "p" for `bernoulli.p`) can change
// its output only through its shape, dtype or device, or is a destination the op
// overwrites whole (`copy_`, `fill_`, `set_`); true for every argument of metadata ops
// (`size`, `dim`, ...).
bool ShapeOnly(absl::string_view op, absl::string_view overload, int tensor_index);

// Whether the kernel reads that argument as indices without bounds checks, so that a
// perturbed value would make it read outside its input (torchvision's RoI kernels read
// each box's image index from `rois`): never perturbed.
bool UncheckedIndex(absl::string_view op, int tensor_index);

// Whether that argument decides the output only for some values (QAT's `observer_on` and
// `fake_quant_on` switches, fake quantization's integer zero points, which matter only
// where a value is clamped): an edge from it that no perturbation proves is unproved, not
// failed, as a predicate's is.
bool SometimesDecisive(absl::string_view op, int tensor_index);

// Whether the op's outputs are uninitialized memory (`empty*`): replay checks their shape
// and dtype only.
bool Uninitialized(absl::string_view op);

// NOTE [Kernels that read memory they never initialized]
// LibTorch 1.13's CPU `linalg_lstsq` with the `gelsy` driver (the default on CPU) hands
// LAPACK a pivot array made with `at::empty`. `?gelsy` reads it on entry (a nonzero entry
// pins that column to the front of the pivoting), so the pivot order depends on whatever
// the allocator left in that memory. The same call on the same arguments then gives
// results a few units in the last place apart (3 to 10 distinct results in 40 calls of
// one float lstsq in Python), and for a wide matrix with two nearly equal columns
// solutions that differ entirely. No other CPU operator tried (svd, eig, eigh, qr, lu,
// solve, pinv, matrix_rank, the other lstsq drivers, sort, topk, unique, median and more,
// 40 calls each between allocations of other sizes) varied. Validation cannot demand bit
// equality from such a kernel: a replay within rounding of the saved value
// (CloseUpToRounding in validation/values.h) counts as checked, and a larger difference
// is reported as unproved, never as a failure (it cannot be told from the kernel's own
// variation).
//
// NOTE [Replays of as_strided]
// `as_strided` and `as_strided_` address their input's storage, not its elements: the
// offset they are given is absolute, and their sizes and strides may reach bytes outside
// the input (`y[0:2].as_strided([2], [1], 3)` reads y[3:5]). A replay runs them on the
// input's saved value, which is a private copy when the model later wrote its bytes
// (copy-on-write) or when it was streamed: the copy starts at offset 0 and holds the
// input's elements only, so the replay reads other bytes than the capture did. Such a
// replay that differs is reported as unproved, never as a failure; the model did nothing
// wrong.

// Why the op's result is not reproducible bit for bit from its arguments (the empty string
// when it is): NOTE [Kernels that read memory they never initialized], NOTE [Replays of
// as_strided]. `args` are the call's arguments.
absl::string_view NotReproducible(absl::string_view op, c10::ArrayRef<c10::IValue> args);

// Whether the tensors `parent_indexes` are factors of a product whose other factor, in
// the saved arguments `saved`, is all zeros (stochastic depth's dropped block), for any
// dtype (a complex zero factor too). Never throws: a check that cannot run exempts nothing.
bool ZeroedByAnotherArgument(absl::string_view op, const std::vector<at::Tensor>& saved,
                             const std::vector<int>& parent_indexes);

// Whether the saved values prove that the arguments `parent_indexes` cannot change this
// call's output (NOTE [Data-dependent exemptions]). `args` are the call's arguments,
// `saved` its tensor arguments and `outputs` its tensor results. Never throws.
bool DataDependentlyExempt(absl::string_view op, c10::ArrayRef<c10::IValue> args,
                           const std::vector<at::Tensor>& saved,
                           const std::vector<int>& parent_indexes,
                           const std::vector<at::Tensor>& outputs);

// Whether the op decides rather than computes (comparisons, isnan, any, argmax, ...; and
// `&`, `|`, `^`, `~` whose `outputs` are all bools, the logical ops written as bitwise
// ones): its output may legitimately not react to any perturbation tried.
bool Predicate(absl::string_view op, const std::vector<at::Tensor>& outputs);

}  // namespace torchlens

#endif  // TORCHLENS_DISPATCH_OPS_EXEMPTIONS_H_
