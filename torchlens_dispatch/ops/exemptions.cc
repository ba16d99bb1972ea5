#include "torchlens_dispatch/ops/exemptions.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <iterator>
#include <optional>

namespace torchlens {
namespace {

// An argument of an operator: (operator name, tensor position in ForEachTensor order; -1
// for every tensor argument).
struct OpArgument {
  absl::string_view op;
  int tensor_index;  // -1: every tensor argument
};

// Arguments whose values cannot change an op's output: tensors it reads only for their
// shape, dtype or device, and destinations it overwrites entirely.
constexpr OpArgument kShapeOnlyArguments[] = {
    {"aten::zeros_like", -1},
    {"aten::ones_like", -1},
    {"aten::empty_like", -1},
    {"aten::full_like", -1},
    {"aten::rand_like", -1},
    {"aten::randn_like", -1},
    {"aten::randint_like", -1},
    {"aten::new_zeros", -1},
    {"aten::new_ones", -1},
    {"aten::new_empty", -1},
    {"aten::new_full", -1},
    {"aten::expand_as", 1},
    {"aten::view_as", 1},
    {"aten::reshape_as", 1},
    {"aten::type_as", 1},
    {"aten::resize_as_", 1},  // only the template's sizes
    {"aten::resize_as_sparse_", 1},
    {"aten::to", 1},  // to.other: the second tensor gives only dtype and device
    {"aten::copy_", 0},
    {"aten::fill_", 0},
    {"aten::zero_", 0},
    {"aten::set_", 0},
    {"aten::normal_", 0},
    {"aten::uniform_", 0},
    {"aten::random_", 0},
    {"aten::exponential_", 0},
    {"aten::cauchy_", 0},
    {"aten::log_normal_", 0},
    {"aten::geometric_", 0},
    {"aten::bernoulli_", 0},
    {"aten::fill", 0},  // fill.Scalar and fill.Tensor: a new tensor of self's shape
    {"aten::copy", 0},  // src broadcast to self's shape
    {"aten::normal_functional", 0},
    // Quantization-aware training's fused observer: with fake quantization on, scale and
    // zero point are computed from the running min and max and written before they are
    // read; with it off, the output is the input and reads neither.
    {"aten::fused_moving_avg_obs_fake_quant", 5},
    {"aten::fused_moving_avg_obs_fake_quant", 6},
    {"aten::_fused_moving_avg_obs_fq_helper", 5},
    {"aten::_fused_moving_avg_obs_fq_helper", 6},
};

// The same, for one overload only: `bernoulli.p(self, p)` draws with probability p in
// self's shape, where `bernoulli(self)` reads self as the probabilities.
struct OverloadArgument {
  absl::string_view op;
  absl::string_view overload;
  int tensor_index;
};
constexpr OverloadArgument kShapeOnlyOverloadArguments[] = {
    {"aten::bernoulli", "p", 0},
};

// Arguments a kernel reads as indices without bounds checks: a perturbed value would make
// it read outside its input (torchvision's RoI kernels take each box's image index from
// column 0 of `rois` and crashed the zoo test under perturbation). Replay and the edge
// check still cover them.
constexpr OpArgument kUncheckedIndexArguments[] = {
    {"torchvision::roi_align", 1},
    {"torchvision::roi_pool", 1},
    {"torchvision::ps_roi_align", 1},
    {"torchvision::ps_roi_pool", 1},
};

// Arguments that decide the output only for some values: an edge from one that no
// perturbation proved is not proved, and that is not a failure.
//   * On/off switches: fake quantization of values already on the quantization grid, or an
//     observer whose running min and max already hold the data's, change nothing.
//   * Integer zero points of fake quantization: (clamp(round(x / s) + z, lo, hi) - z) * s
//     depends on z only where the clamp cuts, and the kernels reject a z outside [lo, hi].
constexpr OpArgument kSometimesDecisiveArguments[] = {
    {"aten::fused_moving_avg_obs_fake_quant", 1},  // observer_on
    {"aten::fused_moving_avg_obs_fake_quant", 2},  // fake_quant_on
    {"aten::_fused_moving_avg_obs_fq_helper", 1},
    {"aten::_fused_moving_avg_obs_fq_helper", 2},
    {"aten::_fake_quantize_per_tensor_affine_cachemask_tensor_qparams", 2},  // zero_point
    {"aten::_fake_quantize_per_tensor_affine_cachemask_tensor_qparams", 3},  // fake_quant_enabled
    {"aten::fake_quantize_per_tensor_affine", 2},
    {"aten::fake_quantize_per_tensor_affine_cachemask", 2},
    {"aten::fake_quantize_per_channel_affine", 2},
    {"aten::fake_quantize_per_channel_affine_cachemask", 2},
    {"aten::_fake_quantize_learnable_per_tensor_affine", 2},
    {"aten::_fake_quantize_learnable_per_channel_affine", 2},
};

// Ops whose outputs are uninitialized memory: replay checks their shape and dtype only.
constexpr absl::string_view kUninitializedOutputs[] = {
    "aten::empty",         "aten::empty_like",        "aten::new_empty",
    "aten::empty_strided", "aten::new_empty_strided",
};

// Ops whose result depends only on their arguments' metadata (shape, dtype, layout).
constexpr absl::string_view kMetadataOps[] = {
    "aten::is_floating_point",
    "aten::is_complex",
    "aten::size",
    "aten::dim",
    "aten::numel",
    "aten::stride",
    "aten::sym_size",
    "aten::sym_numel",
    "aten::sym_stride",
    "aten::is_contiguous",
    "aten::element_size",
    "aten::is_same_size",
    "aten::_shape_as_tensor",
};

// A product with an all-zero factor does not depend on the other factors: stochastic
// depth multiplies a dropped block by a zero mask, and torchvision initializes ViT's head
// weight to zeros. (Operator, the tensor positions that multiply each other.)
struct Product {
  absl::string_view op;
  int factors[2];
};
constexpr Product kProducts[] = {
    {"aten::mul", {0, 1}},    {"aten::mul_", {0, 1}},   {"aten::linear", {0, 1}},
    {"aten::matmul", {0, 1}}, {"aten::mm", {0, 1}},     {"aten::bmm", {0, 1}},
    {"aten::addmm", {1, 2}},  {"aten::conv1d", {0, 1}}, {"aten::conv2d", {0, 1}},
    {"aten::conv3d", {0, 1}},
};

// The source or destination argument of indexing ops (NOTE [Data-dependent exemptions]):
// (Operator, tensor position of the source or destination.)
struct IndexingOp {
  absl::string_view op;
  int source;
};
constexpr IndexingOp kIndexingOps[] = {
    {"aten::index", 0}, {"aten::index_select", 0},   {"aten::gather", 0},
    {"aten::take", 0},  {"aten::take_along_dim", 0},
};

// Whether every element of `t` equals its first, compared in its own dtype (complex
// values, int64 beyond 2^53 and bools compare exactly; NaN is no value's equal).
bool Uniform(const at::Tensor& t) {
  return t.defined() && t.numel() > 0 && t.layout() == at::kStrided && !t.is_quantized() &&
         (t == t.flatten()[0]).all().item<bool>();
}

// Whether two scalar arguments are the same number: integers compared as integers (two
// int64 beyond 2^53 can be one double), the rest as complex doubles.
bool SameNumber(const c10::Scalar& a, const c10::Scalar& b) {
  if (a.isIntegral(/*includeBool=*/true) && b.isIntegral(/*includeBool=*/true)) {
    return a.toLong() == b.toLong();
  }
  return a.toComplexDouble() == b.toComplexDouble();
}

// Ops that decide rather than compute: their output may legitimately not react to any
// perturbation tried (NOTE [Perturbations that can prove] in validation/values.h).
constexpr absl::string_view kPredicates[] = {
    "aten::eq",          "aten::ne",          "aten::lt",         "aten::le",
    "aten::gt",          "aten::ge",          "aten::isnan",      "aten::isinf",
    "aten::isfinite",    "aten::isposinf",    "aten::isneginf",   "aten::any",
    "aten::all",         "aten::logical_and", "aten::logical_or", "aten::logical_xor",
    "aten::logical_not", "aten::sign",        "aten::signbit",    "aten::is_nonzero",
    "aten::equal",       "aten::allclose",    "aten::isclose",    "aten::argmax",
    "aten::argmin",
};

// Bitwise ops: on bools they are the logical ones (`(a > 0) & (b > 0)`), predicates too.
constexpr absl::string_view kBitwiseOps[] = {
    "aten::__and__",      "aten::__or__",       "aten::__xor__",      "aten::__iand__",
    "aten::__ior__",      "aten::__ixor__",     "aten::bitwise_and",  "aten::bitwise_or",
    "aten::bitwise_xor",  "aten::bitwise_not",  "aten::bitwise_and_", "aten::bitwise_or_",
    "aten::bitwise_xor_", "aten::bitwise_not_",
};

// Writes through an index, each taking (self, [dim,] index, source or value, ...).
constexpr absl::string_view kIndexWrites[] = {
    "aten::scatter",        "aten::scatter_",        "aten::scatter_add", "aten::scatter_add_",
    "aten::scatter_reduce", "aten::scatter_reduce_", "aten::index_copy",  "aten::index_copy_",
    "aten::index_fill",     "aten::index_fill_",     "aten::index_add",   "aten::index_add_",
    "aten::index_reduce",   "aten::index_reduce_",   "aten::put",         "aten::put_",
};

// Binary ops with an absorbing operand: anything times 0 or and 0 is 0, anything or all
// bits set is all bits set.
constexpr absl::string_view kAbsorbingZero[] = {
    "aten::mul",         "aten::mul_",         "aten::__and__",  "aten::__iand__",
    "aten::bitwise_and", "aten::bitwise_and_", "aten::multiply", "aten::multiply_",
};
constexpr absl::string_view kAbsorbingAllBits[] = {
    "aten::__or__",
    "aten::__ior__",
    "aten::bitwise_or",
    "aten::bitwise_or_",
};

// Whether `table` names `op`.
template <size_t N>
bool Named(const absl::string_view (&table)[N], absl::string_view op) {
  return std::find(std::begin(table), std::end(table), op) != std::end(table);
}

// Whether `table` lists tensor argument `tensor_index` of `op` (or all of its tensors).
template <size_t N>
bool Listed(const OpArgument (&table)[N], absl::string_view op, int tensor_index) {
  for (const OpArgument& entry : table) {
    if (entry.op == op && (entry.tensor_index < 0 || entry.tensor_index == tensor_index)) {
      return true;
    }
  }
  return false;
}

// Whether `a` and `b`, broadcast together, hold equal values in every element (NaN equal
// to NaN). False when they do not broadcast.
bool SameEverywhere(const at::Tensor& a, const at::Tensor& b) {
  if (!a.defined() || !b.defined()) return false;
  try {
    return (a.eq(b) | (a.isnan() & b.isnan())).all().item<bool>();
  } catch (const std::exception&) {
    return false;
  }
}

// Whether the op overwrites elements of its destination `saved[0]` chosen by index or
// mask tensors, the destination holds one value everywhere, and every value the op could
// write is that value: then the tensors `parent_indexes`, all of them indexes or masks,
// decide nothing (`y[mask] = 0` into zeros, a running argmax recording step 0 into its
// zeros buffer). Writes that combine (accumulate, scatter's reduce) are not overwrites.
bool WritesWhatIsThere(absl::string_view op, c10::ArrayRef<c10::IValue> args,
                       const std::vector<at::Tensor>& saved,
                       const std::vector<int>& parent_indexes) {
  const int count = static_cast<int>(saved.size());
  if (count < 2 || parent_indexes.empty() || !saved[0].defined() || saved[0].numel() == 0) {
    return false;
  }
  // The tensor indexes of the index or mask arguments, [first_index, end_index), and the
  // value written: a tensor argument, or a scalar one.
  int first_index = 1;
  int end_index = 2;
  int written = -1;
  std::optional<at::Scalar> written_scalar;
  const auto is_false = [&](size_t position) {
    return args.size() > position && args[position].isBool() && !args[position].toBool();
  };
  if ((op == "aten::index_put_" || op == "aten::index_put") && args.size() == 4 && is_false(3)) {
    end_index = count - 1;  // (self, indices..., values)
    written = count - 1;
  } else if ((op == "aten::masked_scatter_" || op == "aten::masked_scatter") && count == 3) {
    written = 2;
  } else if ((op == "aten::index_copy_" || op == "aten::index_copy") && count == 3) {
    written = 2;
  } else if ((op == "aten::put_" || op == "aten::put") && count == 3 && is_false(3)) {
    written = 2;
  } else if ((op == "aten::index_fill_" || op == "aten::index_fill" || op == "aten::scatter_" ||
              op == "aten::scatter") &&
             args.size() == 4) {
    if (args[3].isScalar()) {
      written_scalar = args[3].toScalar();
    } else if (count == 3) {
      written = 2;
    } else {
      return false;
    }
  } else {
    return false;
  }
  for (int index : parent_indexes) {
    if (index < first_index || index >= end_index) return false;
  }
  if (written >= count || (written >= 0 && !saved[written].defined())) return false;
  const at::Tensor value = saved[0].flatten()[0];
  if (!SameEverywhere(saved[0], value)) return false;
  return written >= 0
             ? SameEverywhere(saved[written], value)
             : SameEverywhere(at::scalar_tensor(*written_scalar, saved[0].options()), value);
}

}  // namespace

bool UncheckedIndex(absl::string_view op, int tensor_index) {
  return Listed(kUncheckedIndexArguments, op, tensor_index);
}

bool SometimesDecisive(absl::string_view op, int tensor_index) {
  return Listed(kSometimesDecisiveArguments, op, tensor_index);
}

bool Uninitialized(absl::string_view op) { return Named(kUninitializedOutputs, op); }

absl::string_view NotReproducible(absl::string_view op, c10::ArrayRef<c10::IValue> args) {
  if (op == "aten::as_strided" || op == "aten::as_strided_") {
    // See NOTE [Replays of as_strided].
    return "as_strided addresses its input's storage, and replay gives it the saved copy of "
           "its input, which holds the input's elements only, from offset 0";
  }
  // See NOTE [Kernels that read memory they never initialized].
  if (op != "aten::linalg_lstsq" || args.size() < 4 || !args[0].isTensor()) return {};
  const bool gelsy = args[3].isNone() || (args[3].isString() && args[3].toStringRef() == "gelsy");
  if (!gelsy || !args[0].toTensor().is_cpu()) return {};
  return "LibTorch 1.13's CPU linalg_lstsq with the gelsy driver reads a pivot array it never "
         "initialized, so its rounding varies from call to call (driver=\"gelsd\" does not)";
}

bool ShapeOnly(absl::string_view op, absl::string_view overload, int tensor_index) {
  if (Named(kMetadataOps, op)) return true;
  for (const OverloadArgument& entry : kShapeOnlyOverloadArguments) {
    if (entry.op == op && entry.overload == overload && entry.tensor_index == tensor_index) {
      return true;
    }
  }
  return Listed(kShapeOnlyArguments, op, tensor_index);
}

// The exemptions' checks convert and compare saved values that may be of any dtype; one
// that throws on a value exempts nothing (NOTE [Checks that throw] in validation/op_checks.cc).
static bool ZeroedByAnotherArgumentOrThrow(absl::string_view op,
                                           const std::vector<at::Tensor>& saved,
                                           const std::vector<int>& parent_indexes) {
  for (const Product& product : kProducts) {
    if (product.op != op) continue;
    for (int f = 0; f < 2; ++f) {
      const int mine = product.factors[f];
      const int other = product.factors[1 - f];
      if (std::find(parent_indexes.begin(), parent_indexes.end(), mine) == parent_indexes.end() ||
          std::find(parent_indexes.begin(), parent_indexes.end(), other) != parent_indexes.end() ||
          other >= static_cast<int>(saved.size())) {
        continue;
      }
      const at::Tensor& factor = saved[other];
      // Complex factors too: `x @ zeros(2, 2, dtype=complex64)`.
      if (factor.defined() && factor.numel() > 0 && !(factor != 0).any().item<bool>()) {
        return true;
      }
    }
  }
  return false;
}

bool ZeroedByAnotherArgument(absl::string_view op, const std::vector<at::Tensor>& saved,
                             const std::vector<int>& parent_indexes) {
  try {
    return ZeroedByAnotherArgumentOrThrow(op, saved, parent_indexes);
  } catch (const std::exception&) {
    return false;
  }
}

static bool DataDependentlyExemptOrThrow(absl::string_view op, c10::ArrayRef<c10::IValue> args,
                                         const std::vector<at::Tensor>& saved,
                                         const std::vector<int>& parent_indexes,
                                         const std::vector<at::Tensor>& outputs) {
  const auto only = [&](int index) {
    return parent_indexes.size() == 1 && parent_indexes[0] == index;
  };
  const auto defined = [&](int count) {
    if (static_cast<int>(saved.size()) < count) return false;
    for (int i = 0; i < count; ++i) {
      if (!saved[i].defined()) return false;
    }
    return true;
  };
  if (WritesWhatIsThere(op, args, saved, parent_indexes)) return true;
  for (const IndexingOp& indexing : kIndexingOps) {
    if (indexing.op != op) continue;
    const bool indexes_only = std::find(parent_indexes.begin(), parent_indexes.end(),
                                        indexing.source) == parent_indexes.end();
    return indexes_only && indexing.source < static_cast<int>(saved.size()) &&
           Uniform(saved[indexing.source]);
  }
  if (op == "torchvision::nms" && saved.size() >= 2 && saved[1].defined() && outputs.size() == 1 &&
      outputs[0].defined()) {
    const int64_t boxes = saved[1].numel();
    return boxes <= 1 || (only(0) && outputs[0].numel() == boxes);
  }
  // where(condition, self, other) and masked_fill(self, mask, value): a branch that the
  // condition never selects (a guard that did not fire) cannot change the output.
  if (op == "aten::where" && saved.size() >= 3 && saved[0].defined() &&
      saved[0].scalar_type() == at::kBool) {
    const bool reads_self =
        std::find(parent_indexes.begin(), parent_indexes.end(), 1) != parent_indexes.end();
    const bool reads_other =
        std::find(parent_indexes.begin(), parent_indexes.end(), 2) != parent_indexes.end();
    const bool reads_condition =
        std::find(parent_indexes.begin(), parent_indexes.end(), 0) != parent_indexes.end();
    if (reads_condition && !reads_self && !reads_other) {
      // Both branches hold the same values: whatever the condition selects.
      return SameEverywhere(saved[1], saved[2]);
    }
    if (reads_condition || reads_self == reads_other) return false;
    return reads_self ? !saved[0].any().item<bool>() : saved[0].all().item<bool>();
  }
  // heaviside(input, values) reads the values only where the input is zero.
  if (op == "aten::heaviside" && only(1) && defined(2)) {
    return !(saved[0] == 0).any().item<bool>();
  }
  // masked_fill(self, mask, value) and masked_scatter(self, mask, source): self where the
  // mask selects everything, the value or source where it selects nothing.
  if ((op == "aten::masked_fill" || op == "aten::masked_fill_" || op == "aten::masked_scatter" ||
       op == "aten::masked_scatter_") &&
      saved.size() >= 2 && saved[1].defined() && saved[1].scalar_type() == at::kBool) {
    if (only(0)) return saved[1].all().item<bool>();
    if (only(2)) return !saved[1].any().item<bool>();
    // A fill with the value the tensor already holds everywhere, whatever the mask.
    if (only(1) && (op == "aten::masked_fill" || op == "aten::masked_fill_") && args.size() == 3 &&
        saved[0].defined()) {
      if (args[2].isScalar()) {
        return SameEverywhere(saved[0], at::scalar_tensor(args[2].toScalar(), saved[0].options()));
      }
      return saved.size() >= 3 && saved[2].defined() && SameEverywhere(saved[0], saved[2]);
    }
    return false;
  }
  // Writes through an index: the destination where the index reaches every element of
  // it and its own values are not combined in (scatter with src or a value,
  // scatter_reduce and index_reduce with include_self=False, index_copy, index_fill, put
  // without accumulation); the written source or value where the index is empty.
  const auto no_self = [&](size_t position) {
    return args.size() > position && args[position].isBool() && !args[position].toBool();
  };
  // Every write through an index takes (self, [dim,] index, source or value, ...): its
  // source or value cannot change the output when the index is empty.
  if (only(2) && defined(3) && saved[1].numel() == 0 && Named(kIndexWrites, op)) return true;
  const bool scatter = (op == "aten::scatter" || op == "aten::scatter_") && args.size() == 4;
  const bool scatter_reduce = (op == "aten::scatter_reduce" || op == "aten::scatter_reduce_") &&
                              args.size() == 6 && no_self(5);
  if ((scatter || scatter_reduce) && args[1].isInt() && defined(2)) {
    if (only(0)) {
      return at::zeros(saved[0].sizes(), at::kBool)
          .scatter_(args[1].toInt(), saved[1], true)
          .all()
          .item<bool>();
    }
    return false;
  }
  const bool index_copy = op == "aten::index_copy" || op == "aten::index_copy_" ||
                          op == "aten::index_fill" || op == "aten::index_fill_";
  const bool index_reduce =
      (op == "aten::index_reduce" || op == "aten::index_reduce_") && args.size() == 6 && no_self(5);
  if ((index_copy || index_reduce) && args.size() >= 4 && args[1].isInt() && defined(2) &&
      saved[0].dim() > 0) {
    if (only(0)) {
      const int64_t dim = c10::maybe_wrap_dim(args[1].toInt(), saved[0].dim());
      return at::zeros({saved[0].size(dim)}, at::kBool)
          .index_fill_(0, saved[1].flatten(), true)
          .all()
          .item<bool>();
    }
    return false;
  }
  if ((op == "aten::put" || op == "aten::put_") && args.size() == 4 && defined(2)) {
    if (only(0)) {
      return no_self(3) && at::zeros({saved[0].numel()}, at::kBool)
                               .put_(saved[1], at::ones(saved[1].sizes(), at::kBool))
                               .all()
                               .item<bool>();
    }
    return false;
  }
  // An operand that absorbs the other (`i * 0`, `i & 0`, `i | -1` on integers: no
  // perturbation of i shows), a scalar or a tensor that is absorbing everywhere.
  const bool absorbs_zero = Named(kAbsorbingZero, op);
  if ((absorbs_zero || Named(kAbsorbingAllBits, op)) && args.size() >= 2 &&
      parent_indexes.size() == 1 && !outputs.empty() && outputs[0].defined()) {
    at::Tensor other;
    if (parent_indexes[0] == 0 && args[1].isScalar()) {
      other = at::scalar_tensor(args[1].toScalar(), outputs[0].options());
    } else if (saved.size() == 2 && parent_indexes[0] <= 1) {
      other = saved[1 - parent_indexes[0]];
    }
    if (!other.defined() || other.numel() == 0) return false;
    try {
      return absorbs_zero ? !(other != 0).any().item<bool>()
                          : (at::bitwise_not(other) == 0).all().item<bool>();
    } catch (const std::exception&) {
      return false;  // all bits set of a floating value: no such thing
    }
  }
  // pow(x, 0) is all ones, and so is pow(1, e).
  if ((op == "aten::pow" || op == "aten::pow_") && only(0) && args.size() == 2) {
    const c10::IValue& constant = args[0].isScalar() ? args[0] : args[1];
    if (constant.isScalar()) {
      return SameNumber(constant.toScalar(), c10::Scalar(args[0].isScalar() ? 1 : 0));
    }
  }
  if (op == "aten::clamp" && only(0) && args.size() >= 3 && args[1].isScalar() &&
      args[2].isScalar()) {
    if (SameNumber(args[1].toScalar(), args[2].toScalar())) return true;
  }
  // A clamp that clamped every element to one bound (`idx.clamp(max=0)` with every idx
  // above it), a guard that fired everywhere: the input decided nothing the perturbations
  // could show (integers move by one, not past the bound).
  if ((op == "aten::clamp" || op == "aten::clamp_" || op == "aten::clamp_min" ||
       op == "aten::clamp_max" || op == "aten::clamp_min_" || op == "aten::clamp_max_") &&
      only(0) && saved.size() >= 1 && saved[0].defined() && outputs.size() == 1 &&
      outputs[0].defined() && outputs[0].numel() > 0) {
    for (size_t a = 1; a < args.size() && a < 3; ++a) {
      if (!args[a].isScalar()) continue;
      const at::Tensor bound = at::scalar_tensor(args[a].toScalar(), outputs[0].options());
      if ((outputs[0] == bound).all().item<bool>() && (saved[0] != bound).all().item<bool>()) {
        return true;
      }
    }
  }
  // index_put(self, indices, values, accumulate): self where the indices reach every
  // element (and do not accumulate), the values where they reach none (`y[y > 5] = 0`
  // with no element above 5).
  const int values = static_cast<int>(saved.size()) - 1;
  if ((op == "aten::index_put_" || op == "aten::index_put") && (only(0) || only(values)) &&
      values > 0 && args.size() >= 4 && args[1].isList() && args[3].isBool() &&
      saved[0].defined()) {
    c10::List<c10::optional<at::Tensor>> indices;
    for (const c10::IValue& index : args[1].toListRef()) {
      indices.push_back(index.isNone() ? c10::optional<at::Tensor>()
                                       : c10::optional<at::Tensor>(index.toTensor()));
    }
    const at::Tensor covered =
        at::zeros(saved[0].sizes(), at::kBool).index_put_(indices, at::ones({}, at::kBool));
    if (only(0)) return !args[3].toBool() && covered.all().item<bool>();
    return !covered.any().item<bool>();
  }
  return false;
}

bool DataDependentlyExempt(absl::string_view op, c10::ArrayRef<c10::IValue> args,
                           const std::vector<at::Tensor>& saved,
                           const std::vector<int>& parent_indexes,
                           const std::vector<at::Tensor>& outputs) {
  try {
    return DataDependentlyExemptOrThrow(op, args, saved, parent_indexes, outputs);
  } catch (const std::exception&) {
    return false;
  }
}

bool Predicate(absl::string_view op, const std::vector<at::Tensor>& outputs) {
  if (Named(kPredicates, op)) return true;
  for (absl::string_view name : kBitwiseOps) {
    if (name != op) continue;
    return !outputs.empty() && std::all_of(outputs.begin(), outputs.end(), [](const at::Tensor& t) {
      return t.defined() && t.scalar_type() == at::kBool;
    });
  }
  return false;
}

}  // namespace torchlens
