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

}  // namespace
}  // namespace torchlens
