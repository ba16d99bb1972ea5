// Where tensors lie in their storage: what attributes a write to the tensors and buffers
// sharing those bytes (NOTE [Writes through views] and NOTE [Buffer writes] in recorder.h).
#ifndef TORCHLENS_DISPATCH_STORAGE_RANGES_H_
#define TORCHLENS_DISPATCH_STORAGE_RANGES_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <cstdlib>
#include <utility>

#include "graph/trace.h"

namespace torchlens {

// Byte range [begin, end) that `tensor` can touch in its storage (empty for no elements).
inline std::pair<int64_t, int64_t> ByteRange(const at::Tensor& tensor) {
  const int64_t item = static_cast<int64_t>(tensor.element_size());
  const int64_t begin = tensor.storage_offset() * item;
  if (tensor.numel() == 0) return {begin, begin};
  int64_t last = 0;
  for (int64_t d = 0; d < tensor.dim(); ++d) {
    last += (tensor.size(d) - 1) * std::abs(tensor.stride(d));
  }
  return {begin, begin + (last + 1) * item};
}

inline bool Overlap(std::pair<int64_t, int64_t> a, std::pair<int64_t, int64_t> b) {
  return a.first < b.second && b.first < a.second;
}

inline TensorGeometry GeometryOf(const at::Tensor& tensor) {
  return TensorGeometry{tensor.sizes().vec(), tensor.strides().vec(), tensor.storage_offset()};
}

// Whether `a` and `b` lie in the same place of the same storage, as the same dtype.
inline bool SamePlace(const at::Tensor& a, const at::Tensor& b) {
  return a.has_storage() && b.has_storage() && a.storage().is_alias_of(b.storage()) &&
         a.storage_offset() == b.storage_offset() && a.sizes() == b.sizes() &&
         a.strides() == b.strides() && a.scalar_type() == b.scalar_type();
}

}  // namespace torchlens

#endif  // TORCHLENS_DISPATCH_STORAGE_RANGES_H_
