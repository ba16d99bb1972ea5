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

// See NOTE [Vectors built in one arena].
TEST(SharedVectorArenaTest, VectorsMadeInAnArenaBehaveLikeAnyOther) {
  std::weak_ptr<int> watched;
  SharedVector<std::shared_ptr<int>> kept;
  SharedVector<std::shared_ptr<int>> copy;
  {
    SharedVectorArena<std::shared_ptr<int>> arena(/*vectors=*/2, /*elements=*/3);
    SharedVector<std::shared_ptr<int>> first = arena.Make(2);
    SharedVector<std::shared_ptr<int>> second = arena.Make(1);
    EXPECT_TRUE(first.empty());
    first.push_back(std::make_shared<int>(1));
    first.push_back(std::make_shared<int>(2));
    second.push_back(std::make_shared<int>(3));
    watched = first[0];
    // Both blocks are in the one allocation, one after the other.
    EXPECT_LT(first.data(), second.data());
    EXPECT_LT(second.data() - first.data(), 16);
    EXPECT_EQ(*first[1], 2);
    EXPECT_EQ(*second[0], 3);

    copy = first;  // shares the block
    EXPECT_EQ(copy.data(), first.data());
    copy.mutable_at(0) = std::make_shared<int>(10);  // its own block now
    EXPECT_NE(copy.data(), first.data());
    EXPECT_EQ(*first[0], 1);
    EXPECT_EQ(*copy[1], 2);

    second.push_back(std::make_shared<int>(4));  // past its capacity: moves out
    EXPECT_THAT(second, ::testing::SizeIs(2));
    EXPECT_EQ(*second[0], 3);
    EXPECT_EQ(*second[1], 4);

    kept = std::move(first);  // outlives the arena object
  }
  EXPECT_FALSE(watched.expired());
  EXPECT_EQ(*kept[0], 1);
  EXPECT_EQ(*kept[1], 2);
  kept.clear();
  EXPECT_TRUE(watched.expired());  // the last block of the arena went, with its elements
  EXPECT_EQ(*copy[1], 2);          // the copy's own block holds its own references
}

TEST(SharedVectorArenaTest, VectorsPastTheArenasRoomGetBlocksOfTheirOwn) {
  SharedVectorArena<std::string> arena(/*vectors=*/1, /*elements=*/1);
  SharedVector<std::string> in_arena = arena.Make(1);
  SharedVector<std::string> beyond = arena.Make(8);
  SharedVector<std::string> empty = arena.Make(0);
  in_arena.push_back("a string past the inline size of std::string");
  for (int i = 0; i < 8; ++i) beyond.push_back(std::to_string(i));
  EXPECT_THAT(in_arena, ElementsAre("a string past the inline size of std::string"));
  EXPECT_THAT(beyond, ElementsAre("0", "1", "2", "3", "4", "5", "6", "7"));
  EXPECT_TRUE(empty.empty());
  EXPECT_EQ(empty.data(), nullptr);
}

}  // namespace
}  // namespace torchlens
