// The arguments LibTorch's kernels trust, refused before replay calls them with values a
// trace file made up (each case from a helper's review of LibTorch 1.13's sources), and the
// same calls with the arguments a forward pass passes, allowed.
#include "validation/kernel_preconditions.h"

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace torchlens {
namespace {

using ::testing::HasSubstr;

std::string Refused(const char* name, const char* overload, std::vector<c10::IValue> args) {
  const absl::Status status = CheckKernelPreconditions({name, overload}, args);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << name;
  return std::string(status.message());
}

void Allowed(const char* name, const char* overload, std::vector<c10::IValue> args) {
  const absl::Status status = CheckKernelPreconditions({name, overload}, args);
  EXPECT_TRUE(status.ok()) << name << ": " << status;
}

TEST(KernelPreconditionsTest, StridedGeometriesWhoseBytesOverflowAreRefused) {
  const at::Tensor x = at::zeros({4});
  // (2^62 - 1) * 4 wraps to -4: LibTorch's own bounds check passes it.
  EXPECT_THAT(Refused("aten::as_strided", "",
                      {x, std::vector<int64_t>{1}, std::vector<int64_t>{1},
                       int64_t{(int64_t{1} << 62) - 1}}),
              HasSubstr("whose bytes overflow 64 bits"));
  EXPECT_THAT(
      Refused("aten::as_strided", "",
              {x, std::vector<int64_t>{3}, std::vector<int64_t>{int64_t{1} << 62}, int64_t{0}}),
      HasSubstr("whose extent overflows 64 bits"));
  EXPECT_THAT(Refused("aten::as_strided_scatter", "",
                      {x, x, std::vector<int64_t>{2}, std::vector<int64_t>{-1}, c10::IValue()}),
              HasSubstr("negative size or stride"));
  // What a forward passes (a window onto the storage), and one past it, which LibTorch's
  // check refuses itself.
  Allowed("aten::as_strided", "",
          {x, std::vector<int64_t>{2, 2}, std::vector<int64_t>{1, 1}, int64_t{1}});
  Allowed("aten::as_strided", "",
          {x, std::vector<int64_t>{8}, std::vector<int64_t>{1}, int64_t{0}});
}

TEST(KernelPreconditionsTest, EmbeddingBagOffsetsMustStayWithinTheIndices) {
  const at::Tensor weight = at::randn({10, 3});
  const at::Tensor indices = at::tensor({1, 2, 4, 5, 4, 3}, at::kLong);
  auto call = [&](const at::Tensor& offsets, bool include_last_offset) {
    return std::vector<c10::IValue>{weight,     indices, offsets,       false,
                                    int64_t{0}, false,   c10::IValue(), include_last_offset};
  };
  EXPECT_THAT(Refused("aten::embedding_bag", "", call(at::tensor({0, 2, 3}, at::kLong), true)),
              HasSubstr("include_last_offset and a last offset"));
  EXPECT_THAT(Refused("aten::_embedding_bag", "", call(at::tensor({0, 4, 2}, at::kLong), false)),
              HasSubstr("not ascending within the 6 indices"));
  EXPECT_THAT(
      Refused("aten::_embedding_bag_forward_only", "", call(at::tensor({0, 9}, at::kLong), false)),
      HasSubstr("not ascending"));
  Allowed("aten::embedding_bag", "", call(at::tensor({0, 2, 6}, at::kLong), true));
  Allowed("aten::embedding_bag", "padding_idx", call(at::tensor({0, 2}, at::kLong), false));
}

TEST(KernelPreconditionsTest, IndexArgumentsOfOtherKernelsAreChecked) {
  const at::Tensor log_probs = at::randn({5, 2, 4}).log_softmax(2);
  auto ctc = [&](const at::Tensor& targets, std::vector<int64_t> input_lengths) {
    return std::vector<c10::IValue>{
        log_probs,  targets,    input_lengths, std::vector<int64_t>{2, 2},
        int64_t{0}, int64_t{1}, false};
  };
  EXPECT_THAT(
      Refused("aten::ctc_loss", "IntList", ctc(at::tensor({1, 9, 2, 3}).view({2, 2}), {5, 5})),
      HasSubstr("targets outside the 4 classes"));
  EXPECT_THAT(
      Refused("aten::ctc_loss", "IntList", ctc(at::tensor({1, 2, 2, 3}).view({2, 2}), {5, 0})),
      HasSubstr("input length below 1"));
  Allowed("aten::ctc_loss", "IntList", ctc(at::tensor({1, 2, 2, 3}).view({2, 2}), {5, 4}));

  EXPECT_THAT(Refused("aten::repeat_interleave", "Tensor", {at::tensor({5, -3}), int64_t{2}}),
              HasSubstr("negative repeat"));
  Allowed("aten::repeat_interleave", "Tensor", {at::tensor({5, 3}), c10::IValue()});

  EXPECT_THAT(Refused("aten::bincount", "",
                      {at::tensor({int64_t{1}, INT64_MAX}), c10::IValue(), int64_t{0}}),
              HasSubstr("2^31 or more"));
  Allowed("aten::bincount", "", {at::tensor({1, 3, 3}), c10::IValue(), int64_t{0}});

  const at::Tensor sorted = at::tensor({1.0, 3.0, 2.0});
  auto searchsorted = [&](const at::Tensor& sorter) {
    return std::vector<c10::IValue>{sorted, at::tensor({2.5}), false, false, c10::IValue(), sorter};
  };
  EXPECT_THAT(Refused("aten::searchsorted", "Tensor", searchsorted(at::tensor({0, 2, 7}))),
              HasSubstr("sorter entries outside"));
  Allowed("aten::searchsorted", "Tensor", searchsorted(at::tensor({0, 2, 1})));

  EXPECT_THAT(
      Refused("aten::multilabel_margin_loss", "",
              {at::randn({2, 4}), at::tensor({0, 4, -1, 0, 1, -1, 0, 0}).view({2, 4}), int64_t{1}}),
      HasSubstr("targets outside"));
  Allowed("aten::multilabel_margin_loss", "",
          {at::randn({2, 4}), at::tensor({0, 3, -1, 0, 1, -1, 0, 0}).view({2, 4}), int64_t{1}});

  EXPECT_THAT(Refused("aten::_pad_packed_sequence", "",
                      {at::randn({5, 3}), at::tensor({2, 3}), false, 0.0, int64_t{-1}}),
              HasSubstr("not positive and non-increasing"));
  EXPECT_THAT(Refused("aten::_pad_packed_sequence", "",
                      {at::randn({4, 3}), at::tensor({3, 2}), false, 0.0, int64_t{-1}}),
              HasSubstr("do not add up"));
  Allowed("aten::_pad_packed_sequence", "",
          {at::randn({5, 3}), at::tensor({3, 2}), false, 0.0, int64_t{-1}});
}

TEST(KernelPreconditionsTest, ParameterSizesAndAxesAreChecked) {
  const at::Tensor input = at::randn({2, 3, 4});
  EXPECT_THAT(Refused("aten::native_batch_norm", "",
                      {input, at::ones({3}), at::zeros({3}), at::zeros({1}), at::ones({3}), false,
                       0.1, 1e-5}),
              HasSubstr("of 1 elements for 3 channels"));
  Allowed("aten::native_batch_norm", "",
          {input, at::ones({3}), c10::IValue(), at::zeros({3}), at::ones({3}), false, 0.1, 1e-5});

  const at::Tensor x = at::randn({4, 3});
  auto observer = [&](int64_t ch_axis, const at::Tensor& running, bool per_row) {
    return std::vector<c10::IValue>{x,
                                    at::ones({1}),
                                    at::ones({1}),
                                    running,
                                    running,
                                    at::ones({1}),
                                    at::zeros({1}, at::kInt),
                                    0.01,
                                    int64_t{0},
                                    int64_t{255},
                                    ch_axis,
                                    per_row,
                                    false};
  };
  EXPECT_THAT(
      Refused("aten::fused_moving_avg_obs_fake_quant", "", observer(-1, at::zeros({4}), true)),
      HasSubstr("ch_axis -1 outside"));
  Allowed("aten::fused_moving_avg_obs_fake_quant", "", observer(-1, at::zeros({1}), false));
  EXPECT_THAT(
      Refused("aten::_fused_moving_avg_obs_fq_helper", "", observer(0, at::zeros({1}), true)),
      HasSubstr("of 1 elements for 4 channels"));
  Allowed("aten::fused_moving_avg_obs_fake_quant", "", observer(0, at::zeros({4}), true));

  EXPECT_THAT(Refused("aten::fractional_max_pool2d", "",
                      {at::randn({1, 3, 8, 8}), std::vector<int64_t>{2, 2},
                       std::vector<int64_t>{4, 4}, at::rand({1, 1, 2})}),
              HasSubstr("random samples of shape [1, 1, 2], not [1, 3, 2]"));
  Allowed("aten::fractional_max_pool2d", "",
          {at::randn({1, 3, 8, 8}), std::vector<int64_t>{2, 2}, std::vector<int64_t>{4, 4},
           at::rand({1, 3, 2})});
}

TEST(KernelPreconditionsTest, KernelsNoForwardCallsByNameAreNotReplayed) {
  for (const char* name :
       {"aten::max_pool2d_with_indices_backward", "aten::_sparse_coo_tensor_unsafe",
        "aten::_sobol_engine_draw", "aten::_reshape_alias", "aten::from_file",
        "aten::segment_reduce", "aten::native_channel_shuffle", "aten::nll_loss_backward"}) {
    EXPECT_THAT(Refused(name, "", {}), HasSubstr("is not replayed")) << name;
  }
  Allowed("aten::relu", "", {at::randn({3})});
  Allowed("aten::index_select", "", {at::randn({3}), int64_t{0}, at::tensor({7})});
}

}  // namespace
}  // namespace torchlens
