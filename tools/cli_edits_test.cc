// The value an --edit gives a node, in the node's dtype: exactly, or refused naming the
// dtype. Expected values are the decimal text of the flag.
#include "tools/cli_edits.h"

#include <ATen/ATen.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace torchlens {
namespace {

using ::testing::HasSubstr;

EditFlag Flag(const std::string& text) {
  absl::StatusOr<EditFlag> edit = ParseEdit(absl::StrCat("n_1_1:1=", text));
  EXPECT_TRUE(edit.ok()) << edit.status();
  return edit.ok() ? *edit : EditFlag();
}

TEST(EditValue, IntegersExactlyFractionsRefused) {
  const at::Tensor counter = at::zeros({2}, at::kLong);
  absl::StatusOr<at::Tensor> value = EditValue(counter, Flag("9007199254740993"));  // 2^53 + 1
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ((*value)[1].item<int64_t>(), int64_t{9007199254740993});
  value = EditValue(counter, Flag("7.0"));
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ((*value)[0].item<int64_t>(), 7);
  value = EditValue(counter, Flag("7.5"));
  EXPECT_EQ(value.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(value.status().message()),
              HasSubstr("--edit n_1_1:1=7.5: the node holds Long values, and 7.5 is not an "
                        "integer"));
  value = EditValue(at::zeros({1}, at::kByte), Flag("300"));
  EXPECT_THAT(std::string(value.status().message()), HasSubstr("Byte values, and 300 is outside"));
  value = EditValue(at::zeros({1}, at::kBool), Flag("2"));
  EXPECT_THAT(std::string(value.status().message()), HasSubstr("Bool values; give 0 or 1"));
  value = EditValue(at::zeros({1}, at::kBool), Flag("1"));
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_TRUE((*value)[0].item<bool>());
}

TEST(EditValue, FloatingAndComplexTakeAnyNumber) {
  absl::StatusOr<at::Tensor> value = EditValue(at::zeros({2}, at::kHalf), Flag("-0.25"));
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ((*value)[0].item<float>(), -0.25f);
  value = EditValue(at::zeros({2}, at::kComplexFloat), Flag("1.5"));
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ((*value)[1].item<c10::complex<float>>(), c10::complex<float>(1.5f, 0.0f));
}

TEST(Count, SingularAfterOne) {
  EXPECT_EQ(Count(1, "node", "nodes"), "1 node");
  EXPECT_EQ(Count(0, "node", "nodes"), "0 nodes");
  EXPECT_EQ(Count(2, "failure", "failures"), "2 failures");
}

}  // namespace
}  // namespace torchlens
