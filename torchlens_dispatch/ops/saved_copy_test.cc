#include "torchlens_dispatch/ops/saved_copy.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdint>

namespace torchlens {
namespace {

// The copy equals the original, shares no memory with it, and keeps its values when the
// original is then written, for each path NOTE [Streaming copies of saved values] names.
void ExpectIndependentCopy(const at::Tensor& original) {
  const at::Tensor copy = CopyOfSaved(original);
  ASSERT_EQ(copy.sizes(), original.sizes());
  ASSERT_EQ(copy.dtype(), original.dtype());
  EXPECT_FALSE(copy.requires_grad());
  EXPECT_TRUE(at::equal(copy, original));
  if (original.numel() == 0) return;
  EXPECT_NE(copy.data_ptr(), original.data_ptr());
  const at::Tensor before = original.clone();
  original.fill_(7);
  EXPECT_TRUE(at::equal(copy, before));
}

TEST(SavedCopyTest, SmallDenseTensorsAreCopiedExactly) {
  ExpectIndependentCopy(at::arange(12, at::kFloat).reshape({3, 4}));
  ExpectIndependentCopy(at::arange(5, at::kLong));
  ExpectIndependentCopy(at::tensor(3.5));                // zero dimensions
  ExpectIndependentCopy(at::arange(6, at::kInt).gt(2));  // bool
  ExpectIndependentCopy(at::empty({0, 3}));
  // A view at an offset into a larger storage: the copy holds the view's elements only.
  const at::Tensor base = at::arange(10, at::kDouble);
  const at::Tensor tail = base.narrow(0, 4, 6);
  const at::Tensor copy = CopyOfSaved(tail);
  EXPECT_EQ(copy.storage_offset(), 0);
  EXPECT_TRUE(at::equal(copy, at::arange(4, 10, at::kDouble)));
}

TEST(SavedCopyTest, LargeAndNonContiguousTensorsAreCopiedExactly) {
  ExpectIndependentCopy(at::arange(1 << 17, at::kFloat));  // 512 KiB: streaming stores
  ExpectIndependentCopy(at::arange(1 << 17, at::kFloat).add(0.5).narrow(0, 3, 70000));
  const at::Tensor transposed = at::arange(12, at::kFloat).reshape({3, 4}).t();
  const at::Tensor copy = CopyOfSaved(transposed);
  EXPECT_TRUE(at::equal(copy, transposed));
  EXPECT_EQ(copy.strides(), transposed.strides());  // clone keeps a permuted layout
}

TEST(SavedCopyTest, SlicesWithGapsKeepTheirStrides) {
  // NOTE [Saved copies keep their strides]: a reduction over the copy adds in the order
  // the op added over the slice.
  const at::Tensor base = at::randn({300, 77});
  const at::Tensor every_other = base.slice(1, 0, 77, 2);
  ExpectIndependentCopy(base.clone().slice(1, 0, 77, 2));
  const at::Tensor copy = CopyOfSaved(every_other);
  EXPECT_EQ(copy.strides(), every_other.strides());
  EXPECT_TRUE(at::equal(copy.sum(0), every_other.sum(0)));
  // Both running statistics packed in one buffer: a column of a [C, 2] tensor.
  const at::Tensor packed = at::randn({64, 2});
  EXPECT_EQ(CopyOfSaved(packed.select(1, 1)).strides(), packed.select(1, 1).strides());
  // A column of a large matrix would copy the whole span: it is copied dense.
  const at::Tensor column = at::zeros({2048, 2048}).select(1, 3);
  EXPECT_EQ(CopyOfSaved(column).stride(0), 1);
  // Overlapping elements cannot be written with their own strides.
  const at::Tensor expanded = at::arange(3, at::kFloat).expand({4, 3});
  const at::Tensor dense = CopyOfSaved(expanded);
  EXPECT_TRUE(at::equal(dense, expanded));
  EXPECT_EQ(dense.stride(0), 3);
}

TEST(SavedCopyTest, StridedCopyKeepsStridesOfSlicesWithGaps) {
  const at::Tensor packed = at::randn({64, 2});
  const at::Tensor column = packed.select(1, 1);
  const at::Tensor copy = StridedCopy(column);
  EXPECT_EQ(copy.strides(), column.strides());
  EXPECT_TRUE(at::equal(copy, column));
  copy.fill_(3);
  EXPECT_FALSE(at::equal(copy, column));  // its own memory
  const at::Tensor channels_last =
      at::randn({2, 3, 4, 5}).contiguous(at::MemoryFormat::ChannelsLast);
  EXPECT_EQ(StridedCopy(channels_last).strides(), channels_last.strides());
  EXPECT_EQ(StridedCopy(at::arange(3, at::kFloat).expand({4, 3})).stride(0), 3);
}

}  // namespace
}  // namespace torchlens
