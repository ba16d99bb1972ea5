#include "validation/values.h"

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "torchlens_dispatch/ops/bit_identical.h"

namespace torchlens {
namespace {

// NOTE [Perturbations that can prove]: the first perturbations change every element
// arithmetically; the ones after them do not depend on the old values.
constexpr int kArithmeticPerturbations = 3;

// -1 - value, elementwise: changes every finite element. A contiguous float or double
// tensor is written in one loop; a kernel call (rsub wraps its scalar in a tensor and
// builds a TensorIterator) costs more than a small model's op, and validation makes one
// of these per parent of every op. Other tensors keep their strides through at::rsub.
at::Tensor MinusOneMinus(const at::Tensor& value) {
  const at::ScalarType type = value.scalar_type();
  if (value.device().is_cpu() && value.layout() == at::kStrided && value.is_contiguous() &&
      (type == at::kFloat || type == at::kDouble)) {
    // Straight to the CPU allocator: the dispatcher's way to at::empty costs more than
    // the loop below for the small tensors this is for.
    at::Tensor result = at::detail::empty_cpu(value.sizes(), type);
    const int64_t n = value.numel();
    if (type == at::kFloat) {
      const float* in = value.data_ptr<float>();
      float* out = result.data_ptr<float>();
      for (int64_t i = 0; i < n; ++i) out[i] = -1.0f - in[i];
    } else {
      const double* in = value.data_ptr<double>();
      double* out = result.data_ptr<double>();
      for (int64_t i = 0; i < n; ++i) out[i] = -1.0 - in[i];
    }
    return result;
  }
  return at::rsub(value, -1.0);
}

// A large finite value of a floating or complex dtype: 1e30 is none in half precision.
double LargeFinite(at::ScalarType type) {
  return type == at::kHalf || type == at::kComplexHalf ? 65504.0 : 1e30;
}

// A view of the first element of `t` (at index 0 in every dimension), whatever its strides.
at::Tensor FirstElement(const at::Tensor& t) {
  at::Tensor first = t;
  for (int64_t d = 0; d < t.dim(); ++d) first = first.narrow(d, 0, 1);
  return first;
}

}  // namespace

std::optional<std::string> Difference(const at::Tensor& actual, const at::Tensor& expected) {
  if (BitIdentical(actual, expected)) return std::nullopt;
  if (!actual.defined() || !expected.defined()) {
    return std::string(actual.defined() ? "expected no tensor" : "missing tensor");
  }
  if (actual.sizes() != expected.sizes()) {
    return absl::StrCat("shape [", absl::StrJoin(actual.sizes(), ", "), "] instead of [",
                        absl::StrJoin(expected.sizes(), ", "), "]");
  }
  if (actual.scalar_type() != expected.scalar_type()) {
    return absl::StrCat("dtype ", c10::toString(actual.scalar_type()), " instead of ",
                        c10::toString(expected.scalar_type()));
  }
  if (actual.layout() != expected.layout() || actual.is_quantized() != expected.is_quantized()) {
    return std::string("another layout");
  }
  try {
    const at::Tensor a = actual.is_quantized() ? actual.dequantize() : actual.to_dense();
    const at::Tensor b = expected.is_quantized() ? expected.dequantize() : expected.to_dense();
    if (a.is_floating_point() || a.is_complex()) {
      // Complex values differ by the modulus of their difference (a cast to double would
      // drop the imaginary parts).
      const c10::ScalarType wide = a.is_complex() ? at::kComplexDouble : at::kDouble;
      const at::Tensor diff = (a.resolve_conj().to(wide) - b.resolve_conj().to(wide)).abs();
      const at::Tensor finite = at::where(at::isnan(diff), at::zeros_like(diff), diff);
      const bool nan_placement = at::isnan(diff).any().item<bool>();
      if (finite.max().item<double>() == 0 && !nan_placement) {
        return std::string("equal values, different bits (signed zeros or NaN payloads)");
      }
      return absl::StrFormat("max abs difference %.6g%s", finite.max().item<double>(),
                             nan_placement ? " (and NaN placement)" : "");
    }
    return absl::StrCat((a != b).sum().item<int64_t>(), " of ", a.numel(), " elements differ");
  } catch (const std::exception&) {
    return std::string("different values");
  }
}

std::optional<at::Tensor> Perturbation(const at::Tensor& value, int attempt,
                                       absl::FunctionRef<at::Generator&()> generator) {
  if (value.is_quantized()) {
    // The integers perturbed, on the same quantization grid: a quantized kernel sees
    // other values of the same scale and zero point.
    const c10::QScheme scheme = value.qscheme();
    if (scheme != at::kPerTensorAffine && scheme != at::kPerChannelAffine &&
        scheme != at::kPerChannelAffineFloatQParams) {
      return std::nullopt;
    }
    std::optional<at::Tensor> integers = Perturbation(value.int_repr(), attempt, generator);
    if (!integers) return std::nullopt;
    return scheme == at::kPerTensorAffine
               ? at::_make_per_tensor_quantized_tensor(*integers, value.q_scale(),
                                                       value.q_zero_point())
               : at::_make_per_channel_quantized_tensor(*integers, value.q_per_channel_scales(),
                                                        value.q_per_channel_zero_points(),
                                                        value.q_per_channel_axis());
  }
  const bool floating = value.is_floating_point() || value.is_complex();
  if (value.scalar_type() == at::kBool) {
    switch (attempt) {
      case 0:
        return at::logical_not(value);
      case 1:
        return at::ones_like(value);
      case 2:
        return at::zeros_like(value);
      case 3: {
        at::Tensor flipped = value.clone();
        if (value.numel() > 0) FirstElement(flipped).logical_not_();
        return flipped;
      }
      default:
        return std::nullopt;
    }
  }
  if (attempt == 0) return floating ? MinusOneMinus(value) : value + 1;
  if (attempt < kArithmeticPerturbations) {
    if (!floating) return attempt == 1 ? value - 1 : -value;
    const double magnitude = value.numel() == 0 ? 1.0 : value.abs().max().item<double>() + 1.0;
    return attempt == 1
               ? value + 1000.0 * magnitude
               : at::randn(value.sizes(), generator(), value.options()) * (3.0 * magnitude);
  }
  // NOTE [Perturbations that can prove]: values that do not depend on the old ones.
  switch (attempt - kArithmeticPerturbations) {
    case 0:
      return at::zeros_like(value);
    case 1:
      return at::ones_like(value);
    case 2: {
      // In the value's own dtype, never through a double: a complex element has no double,
      // and an int64 beyond 2^53 has none that differs from it by one.
      at::Tensor changed = value.clone();
      if (changed.numel() == 0) return changed;
      at::Tensor first = FirstElement(changed);
      if (floating) {
        first.neg_().sub_(1);
      } else {
        first.add_(1);
      }
      return changed;
    }
    case 3:
      return floating ? at::randn(value.sizes(), generator(), value.options())
                      : at::full_like(value, -1);
    case 4:
      return floating ? at::full_like(value, std::numeric_limits<double>::infinity())
                      : at::full_like(value, 2);
    case 5:
      if (floating) return at::full_like(value, -std::numeric_limits<double>::infinity());
      return std::nullopt;
    case 6:
      if (floating) return at::full_like(value, std::numeric_limits<double>::quiet_NaN());
      return std::nullopt;
    case 7:
      // The largest finite value of the dtype: 1e30 is none for half precision.
      if (floating) return at::full_like(value, LargeFinite(value.scalar_type()));
      return std::nullopt;
    default:
      return std::nullopt;
  }
}

bool CloseUpToRounding(const at::Tensor& actual, const at::Tensor& expected) {
  if (!Difference(actual, expected)) return true;
  if (!actual.defined() || !expected.defined() || actual.sizes() != expected.sizes() ||
      actual.scalar_type() != expected.scalar_type() || actual.layout() != at::kStrided ||
      expected.layout() != at::kStrided) {
    return false;
  }
  try {
    if (!expected.is_floating_point() && !expected.is_complex()) return actual.equal(expected);
    const auto as_real = [](const at::Tensor& t) {
      const at::Tensor resolved = t.resolve_conj().resolve_neg();
      return (resolved.is_complex() ? at::view_as_real(resolved) : resolved).to(at::kDouble);
    };
    const at::Tensor a = as_real(actual);
    const at::Tensor b = as_real(expected);
    if (b.numel() == 0) return true;
    const double scale = std::max(1.0, at::nan_to_num(b.abs(), 0, 0, 0).max().item<double>());
    return at::allclose(a, b, /*rtol=*/0, /*atol=*/1e-4 * scale, /*equal_nan=*/true);
  } catch (const std::exception&) {
    return false;
  }
}

bool AllFinite(const at::Tensor& t) {
  try {
    if (!t.defined() || t.numel() == 0 || t.layout() != at::kStrided || t.is_quantized() ||
        !(t.is_floating_point() || t.is_complex())) {
      return true;
    }
    return at::isfinite(t).all().item<bool>();
  } catch (const std::exception&) {
    return true;
  }
}

bool NonFiniteEverywhere(const std::vector<at::Tensor>& outputs) {
  if (outputs.empty()) return false;
  try {
    for (const at::Tensor& t : outputs) {
      if (!t.defined() || t.numel() == 0 || t.layout() != at::kStrided || t.is_quantized() ||
          !(t.is_floating_point() || t.is_complex()) || at::isfinite(t).any().item<bool>()) {
        return false;
      }
    }
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace torchlens
