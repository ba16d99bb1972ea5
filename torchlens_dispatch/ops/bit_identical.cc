#include "torchlens_dispatch/ops/bit_identical.h"

#include <ATen/ATen.h>

#include <cstring>

namespace torchlens {
namespace {

bool SameBytes(const at::Tensor& a, const at::Tensor& b) {
  if (a.numel() == 0) return true;
  // The values as read: a lazy conjugate or negative view applies its bit first.
  const at::Tensor ca = a.resolve_conj().resolve_neg().contiguous();
  const at::Tensor cb = b.resolve_conj().resolve_neg().contiguous();
  return std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()) == 0;
}

}  // namespace

bool BitIdentical(const at::Tensor& a, const at::Tensor& b) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined();
  if (a.unsafeGetTensorImpl() == b.unsafeGetTensorImpl()) return true;
  if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type() || a.layout() != b.layout() ||
      a.device() != b.device() || a.is_quantized() != b.is_quantized()) {
    return false;
  }
  try {
    if (a.is_meta()) return true;  // no values to compare
    if (a.layout() == at::kSparse) {
      const at::Tensor ca = a.coalesce();
      const at::Tensor cb = b.coalesce();
      return BitIdentical(ca._indices(), cb._indices()) && BitIdentical(ca._values(), cb._values());
    }
    if (a.is_quantized()) {
      if (a.qscheme() != b.qscheme()) return false;
      if (a.qscheme() == at::kPerTensorAffine || a.qscheme() == at::kPerTensorSymmetric) {
        if (a.q_scale() != b.q_scale() || a.q_zero_point() != b.q_zero_point()) return false;
      } else if (!BitIdentical(a.q_per_channel_scales(), b.q_per_channel_scales()) ||
                 !BitIdentical(a.q_per_channel_zero_points(), b.q_per_channel_zero_points()) ||
                 a.q_per_channel_axis() != b.q_per_channel_axis()) {
        return false;
      }
      return SameBytes(a.int_repr(), b.int_repr());
    }
    if (a.layout() != at::kStrided) return at::equal(a, b);  // mkldnn and the like
    if (!a.device().is_cpu()) return SameBytes(a.cpu(), b.cpu());
    return SameBytes(a, b);
  } catch (const std::exception&) {
    return false;  // values that cannot be read compare as different, never as equal
  }
}

}  // namespace torchlens
