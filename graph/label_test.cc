#include "graph/label.h"

#include "gtest/gtest.h"

namespace torchlens {
namespace {

TEST(ParseKey, SplitsBaseAndPass) {
  absl::StatusOr<ParsedKey> key = ParseKey("relu_1_2:3");
  ASSERT_TRUE(key.ok()) << key.status();
  EXPECT_EQ(key->base, "relu_1_2");
  EXPECT_EQ(key->pass, 3);
}

TEST(ParseKey, BaseWithoutPass) {
  absl::StatusOr<ParsedKey> key = ParseKey("bn.running_mean");
  ASSERT_TRUE(key.ok()) << key.status();
  EXPECT_EQ(key->base, "bn.running_mean");
  EXPECT_FALSE(key->pass.has_value());
}

TEST(ParseKey, RejectsMalformedKeys) {
  for (const char* bad : {"", ":", "relu:", ":3", "relu_1_2:0", "relu_1_2:x", "relu 1", "a:b:1",
                          "relu_1_2:-1", "relu_1_2:99999999999"}) {
    absl::StatusOr<ParsedKey> key = ParseKey(bad);
    EXPECT_EQ(key.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(key.status().message().find("malformed key"), absl::string_view::npos) << bad;
  }
}

TEST(Labels, LayerPassLabelIsThePassLabelOfTheLayerBase) {
  EXPECT_EQ(LayerPassLabel("relu", 1, 2, 3), "relu_1_2:3");
  EXPECT_EQ(LayerPassLabel("linear", 1999, 3997, 1), PassLabel("linear_1999_3997", 1));
  absl::StatusOr<ParsedKey> key = ParseKey(LayerPassLabel("batch_norm", 12, 40, 5));
  ASSERT_TRUE(key.ok()) << key.status();
  EXPECT_EQ(key->base, "batch_norm_12_40");
  EXPECT_EQ(key->pass, 5);
  // The widest numbers an int holds, and a type past std::string's inline size.
  EXPECT_EQ(LayerPassLabel("a_very_long_operator_type", -2147483647 - 1, 2147483647, 1),
            "a_very_long_operator_type_-2147483648_2147483647:1");
}

TEST(Labels, BufferPassLabelNamesTheBufferByNumber) {
  EXPECT_EQ(BufferPassLabel(2, 3), "buffer_2:3");
  EXPECT_EQ(BufferPassLabel(12, 1001), PassLabel("buffer_12", 1001));
}

}  // namespace
}  // namespace torchlens
