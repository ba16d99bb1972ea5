#include "graph/shared_vector.h"

#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace torchlens {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

// Elements whose reference counts tell who holds them.
std::vector<std::shared_ptr<int>> Counted(int n) {
  std::vector<std::shared_ptr<int>> values;
  for (int i = 0; i < n; ++i) values.push_back(std::make_shared<int>(i));
  return values;
}

TEST(SharedVectorTest, StartsEmpty) {
  SharedVector<std::string> v;
  EXPECT_TRUE(v.empty());
  EXPECT_EQ(v.size(), 0u);
  EXPECT_EQ(v.begin(), v.end());
  EXPECT_THAT(v, IsEmpty());
  EXPECT_TRUE(v.ToVector().empty());
}

TEST(SharedVectorTest, ReadsAsTheVectorItWasBuiltFrom) {
  SharedVector<std::string> v(std::vector<std::string>{"a", "a long string past the inline size"});
  EXPECT_THAT(v, ElementsAre("a", "a long string past the inline size"));
  EXPECT_EQ(v[1], "a long string past the inline size");
  EXPECT_EQ(v.front(), "a");
  EXPECT_EQ(v.back(), "a long string past the inline size");
  v = {"x"};
  EXPECT_THAT(v, ElementsAre("x"));
}

TEST(SharedVectorTest, CopiesShareTheElementsWithoutCopyingThem) {
  const std::vector<std::shared_ptr<int>> elements = Counted(3);
  SharedVector<std::shared_ptr<int>> original(elements);
  EXPECT_EQ(elements[0].use_count(), 2);  // `elements` and one copy inside `original`
  SharedVector<std::shared_ptr<int>> copy = original;
  SharedVector<std::shared_ptr<int>> another;
  another = copy;
  EXPECT_EQ(copy.data(), original.data());
  EXPECT_EQ(another.data(), original.data());
  EXPECT_EQ(elements[0].use_count(), 2);  // still one copy of the element
  EXPECT_TRUE(copy == original);
}

TEST(SharedVectorTest, AWriteGivesTheWriterItsOwnElements) {
  const std::vector<std::shared_ptr<int>> elements = Counted(3);
  SharedVector<std::shared_ptr<int>> original(elements);
  SharedVector<std::shared_ptr<int>> copy = original;
  copy.mutable_at(1) = std::make_shared<int>(41);
  EXPECT_NE(copy.data(), original.data());
  EXPECT_EQ(*original[1], 1);  // the original is unchanged
  EXPECT_EQ(*copy[1], 41);
  EXPECT_EQ(copy[0], original[0]);
  EXPECT_EQ(elements[0].use_count(), 3);  // `elements`, `original` and `copy`
  EXPECT_FALSE(copy == original);

  // The block is the writer's own now: further writes do not copy it again.
  const std::shared_ptr<int>* own = copy.data();
  copy.mutable_at(2) = std::make_shared<int>(42);
  for (std::shared_ptr<int>& element : copy.mutable_span()) *element += 0;
  EXPECT_EQ(copy.data(), own);
}

TEST(SharedVectorTest, PushBackOnASharedVectorLeavesTheOtherCopyAlone) {
  SharedVector<std::string> original;
  original.reserve(2);
  original.push_back("a");
  SharedVector<std::string> copy = original;
  copy.push_back("b");
  original.push_back("c");
  EXPECT_THAT(original, ElementsAre("a", "c"));
  EXPECT_THAT(copy, ElementsAre("a", "b"));
  for (int i = 0; i < 100; ++i) copy.push_back(std::to_string(i));  // grows past capacity
  EXPECT_EQ(copy.size(), 102u);
  EXPECT_EQ(copy[101], "99");
  EXPECT_THAT(original, ElementsAre("a", "c"));
}

TEST(SharedVectorTest, ResizeAndClearAffectOnlyThisCopy) {
  const std::vector<std::shared_ptr<int>> elements = Counted(4);
  SharedVector<std::shared_ptr<int>> original(elements);
  SharedVector<std::shared_ptr<int>> shrunk = original;
  shrunk.resize(1);
  SharedVector<std::shared_ptr<int>> grown = original;
  grown.resize(6);
  SharedVector<std::shared_ptr<int>> cleared = original;
  cleared.clear();
  EXPECT_EQ(original.size(), 4u);
  EXPECT_EQ(shrunk.size(), 1u);
  EXPECT_EQ(grown.size(), 6u);
  EXPECT_EQ(grown[5], nullptr);  // value-initialized
  EXPECT_TRUE(cleared.empty());
  // `elements`, `original`, `shrunk` (element 0 only) and `grown`.
  EXPECT_EQ(elements[0].use_count(), 4);
  EXPECT_EQ(elements[3].use_count(), 3);
}

TEST(SharedVectorTest, TheLastCopyToGoFreesTheElements) {
  std::weak_ptr<int> watched;
  {
    std::vector<std::shared_ptr<int>> elements = Counted(2);
    watched = elements[0];
    SharedVector<std::shared_ptr<int>> a(std::move(elements));
    SharedVector<std::shared_ptr<int>> b = a;
    SharedVector<std::shared_ptr<int>> c = std::move(b);
    a.clear();
    EXPECT_FALSE(watched.expired());  // `c` still holds them
  }
  EXPECT_TRUE(watched.expired());
}

}  // namespace
}  // namespace torchlens
