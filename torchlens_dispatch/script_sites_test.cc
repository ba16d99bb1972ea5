#include "torchlens_dispatch/script_sites.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "gtest/gtest.h"

namespace torchlens {
namespace {

ParsedHierarchy Parse(const std::vector<std::string>& hierarchy) {
  return ParseModuleHierarchy(hierarchy);
}

TEST(ParseModuleHierarchy, NestedInstances) {
  const ParsedHierarchy parsed = Parse({"TOP(Net)::forward", "block1(ConvBlock)::forward",
                                        "conv(Conv2d)::forward", "SELF(Conv2d)::_conv_forward"});
  EXPECT_EQ(parsed.address, "block1.conv");
  EXPECT_EQ(parsed.innermost, 2u);
}

TEST(ParseModuleHierarchy, FreeFunctionsStayInTheirModule) {
  const ParsedHierarchy parsed = Parse(
      {"TOP(Net)::forward", "bn(BatchNorm2d)::forward", "CALL_FUNCTION::batch_norm()::batch_norm"});
  EXPECT_EQ(parsed.address, "bn");
  EXPECT_EQ(parsed.innermost, 1u);
  EXPECT_EQ(Parse({"TOP(Net)::forward", "::helper"}).address, "");
}

TEST(ParseModuleHierarchy, MethodOnSelfUnderTheInstanceName) {
  const ParsedHierarchy parsed =
      Parse({"TOP(Demo)::forward", "stem(Conv2d)::forward", "stem(Conv2d)::_conv_forward"});
  EXPECT_EQ(parsed.address, "stem");
  EXPECT_EQ(parsed.innermost, 1u);
}

// Modules nested in each other under one attribute name and type: the same method of the
// same instance and type again is a submodule (TorchScript methods never call themselves).
// Such chains used to collapse into the outermost module.
TEST(ParseModuleHierarchy, NestedModulesOfTheSameNameAndType) {
  const ParsedHierarchy parsed =
      Parse({"TOP(Net)::forward", "inner(Wrap)::forward", "inner(Wrap)::forward",
             "inner(Wrap)::helper", "inner(Wrap)::forward"});
  EXPECT_EQ(parsed.address, "inner.inner.inner");
  EXPECT_EQ(parsed.innermost, 4u);
}

TEST(ParseModuleHierarchy, UnnamedInstanceFromAModuleListLoop) {
  const ParsedHierarchy parsed =
      Parse({"TOP(Net)::forward", "classifier(ASPP)::forward",
             "INSTANCE_NAME_UNKNOWN(ASPPConv)::forward", "1(BatchNorm2d)::forward"});
  EXPECT_EQ(parsed.address, "classifier.1");
  EXPECT_FALSE(parsed.unknown_instance);
  const ParsedHierarchy unknown = Parse({"TOP(Net)::forward", "classifier(ASPP)::forward",
                                         "INSTANCE_NAME_UNKNOWN(ASPPConv)::forward"});
  EXPECT_EQ(unknown.address, "classifier");
  EXPECT_TRUE(unknown.unknown_instance);
}

TEST(ModuleAddresses, ResolvesModulesReachedThroughContainers) {
  auto addresses = std::make_shared<std::vector<std::string>>(
      std::vector<std::string>{"", "convs", "convs.0", "convs.0.1", "head"});
  absl::flat_hash_map<std::string, int32_t> ids;
  for (size_t i = 0; i < addresses->size(); ++i) ids[(*addresses)[i]] = static_cast<int32_t>(i);
  const std::vector<std::string> types = {"Net", "ModuleList", "Sequential", "BatchNorm2d",
                                          "Linear"};
  const std::vector<std::vector<int32_t>> children = {{1, 4}, {2}, {3}, {}, {}};
  ModuleAddresses modules(ModuleTree{1, addresses, &ids, &types, &children});
  bool unresolved = false;
  // The interpreter names convs[0] "0" and its BatchNorm "1".
  EXPECT_EQ(modules.Resolve({{"0", "Sequential"}, {"1", "BatchNorm2d"}}, &unresolved), 3);
  EXPECT_FALSE(unresolved);
  EXPECT_EQ(modules.Resolve({{"head", "Linear"}}, &unresolved), 4);
  EXPECT_EQ(modules.Resolve({{"nothing", "Linear"}}, &unresolved), 0);
  EXPECT_TRUE(unresolved);
}

TEST(ParseModuleHierarchy, RootOnly) {
  const ParsedHierarchy parsed = Parse({"TOP(Net)::forward"});
  EXPECT_EQ(parsed.address, "");
  EXPECT_EQ(parsed.innermost, 0u);
}

}  // namespace
}  // namespace torchlens
