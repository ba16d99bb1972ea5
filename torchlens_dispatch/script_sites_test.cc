#include "torchlens_dispatch/script_sites.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace torchlens {
namespace {

struct Parsed {
  std::string address;
  size_t innermost;
};

Parsed Parse(const std::vector<std::string>& hierarchy) {
  Parsed parsed;
  ParseModuleHierarchy(hierarchy, &parsed.address, &parsed.innermost);
  return parsed;
}

TEST(ParseModuleHierarchy, NestedInstances) {
  const Parsed parsed = Parse({"TOP(Net)::forward", "block1(ConvBlock)::forward",
                               "conv(Conv2d)::forward", "SELF(Conv2d)::_conv_forward"});
  EXPECT_EQ(parsed.address, "block1.conv");
  EXPECT_EQ(parsed.innermost, 2u);
}

TEST(ParseModuleHierarchy, FreeFunctionsStayInTheirModule) {
  const Parsed parsed = Parse(
      {"TOP(Net)::forward", "bn(BatchNorm2d)::forward", "CALL_FUNCTION::batch_norm()::batch_norm"});
  EXPECT_EQ(parsed.address, "bn");
  EXPECT_EQ(parsed.innermost, 1u);
  EXPECT_EQ(Parse({"TOP(Net)::forward", "::helper"}).address, "");
}

TEST(ParseModuleHierarchy, MethodOnSelfUnderTheInstanceName) {
  const Parsed parsed =
      Parse({"TOP(Demo)::forward", "stem(Conv2d)::forward", "stem(Conv2d)::_conv_forward"});
  EXPECT_EQ(parsed.address, "stem");
  EXPECT_EQ(parsed.innermost, 1u);
}

TEST(ParseModuleHierarchy, RootOnly) {
  const Parsed parsed = Parse({"TOP(Net)::forward"});
  EXPECT_EQ(parsed.address, "");
  EXPECT_EQ(parsed.innermost, 0u);
}

}  // namespace
}  // namespace torchlens
