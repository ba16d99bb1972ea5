// Where tensors lie in their storage: what attributes a write to the tensors and buffers
// sharing those bytes (NOTE [Writes through views] and NOTE [Buffer writes] in recorder.h).
#ifndef TORCHLENS_DISPATCH_OPS_STORAGE_RANGES_H_
#define TORCHLENS_DISPATCH_OPS_STORAGE_RANGES_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <cstdlib>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "torchlens_dispatch/ops/tensor_geometry.h"

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

// Elements [first, last + 1) of the storage that `geometry` reaches ([offset, offset) when
// it has no elements), as ByteRange gives a live tensor's in bytes. kInvalidArgument naming
// why no tensor has that geometry: a negative size, stride or offset, or a reach whose
// elements or bytes of `element_size` overflow 64 bits. Geometries a trace file holds, and
// the arguments replay passes, are whatever the file says (NOTE [Kernels that trust their
// arguments] in validation/kernel_preconditions.h).
inline absl::StatusOr<std::pair<int64_t, int64_t>> CheckedElementRange(
    const TensorGeometry& geometry, int64_t element_size) {
  if (geometry.sizes.size() != geometry.strides.size()) {
    return absl::InvalidArgumentError("sizes and strides of different lengths");
  }
  if (geometry.storage_offset < 0) return absl::InvalidArgumentError("a negative offset");
  bool empty = false;
  for (size_t d = 0; d < geometry.sizes.size(); ++d) {
    if (geometry.sizes[d] < 0 || geometry.strides[d] < 0) {
      return absl::InvalidArgumentError("a negative size or stride");
    }
    empty = empty || geometry.sizes[d] == 0;
  }
  if (empty) return std::make_pair(geometry.storage_offset, geometry.storage_offset);
  int64_t last = geometry.storage_offset;
  for (size_t d = 0; d < geometry.sizes.size(); ++d) {
    int64_t reach = 0;
    if (__builtin_mul_overflow(geometry.sizes[d] - 1, geometry.strides[d], &reach) ||
        __builtin_add_overflow(last, reach, &last)) {
      return absl::InvalidArgumentError("a geometry whose extent overflows 64 bits");
    }
  }
  int64_t bytes = 0;
  if (__builtin_add_overflow(last, 1, &last) ||
      __builtin_mul_overflow(last, element_size, &bytes)) {
    return absl::InvalidArgumentError("a geometry whose bytes overflow 64 bits");
  }
  return std::make_pair(geometry.storage_offset, last);
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

#endif  // TORCHLENS_DISPATCH_OPS_STORAGE_RANGES_H_
