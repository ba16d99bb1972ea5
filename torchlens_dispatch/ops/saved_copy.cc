#include "torchlens_dispatch/ops/saved_copy.h"

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>

#include "absl/container/inlined_vector.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace torchlens {
namespace {

constexpr size_t kStreamingMinBytes = 256 << 10;

// Whether `saved` is one dense block of plain bytes in CPU memory (NOTE [Streaming copies
// of saved values]).
bool IsPlainDenseBlock(const at::Tensor& saved) {
  return saved.device().is_cpu() && saved.layout() == at::kStrided && !saved.is_quantized() &&
         !saved.is_conj() && !saved.is_neg() && saved.has_storage() && saved.is_contiguous();
}

// Whether `tensor` is strided with gaps between its elements but none of them shared:
// sorted by stride, each dimension steps past the farthest offset of the ones inside it.
bool StridedWithoutOverlap(const at::Tensor& tensor) {
  if (tensor.layout() != at::kStrided || tensor.is_quantized() || tensor.is_conj() ||
      tensor.is_neg() || !tensor.has_storage() || tensor.is_non_overlapping_and_dense()) {
    return false;
  }
  absl::InlinedVector<std::pair<int64_t, int64_t>, 6> dims;  // (stride, size), size > 1
  for (int64_t d = 0; d < tensor.dim(); ++d) {
    if (tensor.size(d) == 0) return false;  // nothing to copy: clone is as good
    if (tensor.size(d) > 1) dims.emplace_back(tensor.stride(d), tensor.size(d));
  }
  std::sort(dims.begin(), dims.end());
  int64_t reach = 0;  // the farthest offset the dimensions so far reach
  for (const auto& [stride, size] : dims) {
    if (stride <= reach) return false;
    reach += stride * (size - 1);
  }
  const int64_t extent = reach + 1;
  // The copy's storage spans the gaps: a column of a large matrix stays a dense copy.
  constexpr int64_t kAlwaysBytes = 1 << 20;
  return extent <= 4 * tensor.numel() ||
         extent * static_cast<int64_t>(tensor.element_size()) <= kAlwaysBytes;
}

}  // namespace

at::Tensor StridedCopy(const at::Tensor& tensor) {
  if (!StridedWithoutOverlap(tensor)) return tensor.clone();
  // See NOTE [Saved copies keep their strides].
  at::Tensor copy = at::empty_strided(tensor.sizes(), tensor.strides(), tensor.options());
  copy.copy_(tensor);
  return copy;
}

at::Tensor CopyOfSaved(const at::Tensor& saved) {
  if (!IsPlainDenseBlock(saved)) return StridedCopy(saved);
  const size_t bytes = saved.nbytes();
  // Straight to the CPU allocator: the dispatcher's way to at::empty costs as much as
  // the copy of a small buffer (BufferJournal snapshots dozens per capture). The copy is
  // dense, strided and requires no grad, as at::empty's would be.
  at::Tensor copy = at::detail::empty_cpu(saved.sizes(), saved.scalar_type());
  if (bytes == 0) return copy;
  const char* from = static_cast<const char*>(saved.data_ptr());
  char* to = static_cast<char*>(copy.data_ptr());
#if defined(__SSE2__)
  if (bytes >= kStreamingMinBytes) {
    size_t done = 0;
    // Streaming stores need 16-byte aligned destinations; the allocator gives 64.
    if (reinterpret_cast<uintptr_t>(to) % 16 == 0) {
      for (; done + 64 <= bytes; done += 64) {  // one cache line per step
        const __m128i* in = reinterpret_cast<const __m128i*>(from + done);
        __m128i* out = reinterpret_cast<__m128i*>(to + done);
        const __m128i a = _mm_loadu_si128(in), b = _mm_loadu_si128(in + 1);
        const __m128i c = _mm_loadu_si128(in + 2), d = _mm_loadu_si128(in + 3);
        _mm_stream_si128(out, a);
        _mm_stream_si128(out + 1, b);
        _mm_stream_si128(out + 2, c);
        _mm_stream_si128(out + 3, d);
      }
      _mm_sfence();  // the streamed lines are visible before anyone reads the copy
    }
    std::memcpy(to + done, from + done, bytes - done);
    return copy;
  }
#endif
  std::memcpy(to, from, bytes);
  return copy;
}

at::Tensor DetachedAlias(const at::Tensor& tensor) {
  c10::TensorImpl* impl = tensor.unsafeGetTensorImpl();
  c10::intrusive_ptr<c10::TensorImpl> alias = impl->shallow_copy_and_detach(
      /*version_counter=*/impl->version_counter(), /*allow_tensor_metadata_change=*/false);
  alias->set_autograd_meta(nullptr);
  return at::Tensor(std::move(alias));
}

}  // namespace torchlens
