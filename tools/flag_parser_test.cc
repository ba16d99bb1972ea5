#include "tools/flag_parser.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace torchlens {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

struct Parsed {
  bool verbose = false;
  std::string name;
  int64_t count = 0;
  int small = 0;
  std::vector<std::string> list;
  std::vector<std::string> repeated;
};

absl::Status ParseInto(Parsed& parsed, const std::vector<std::string>& args) {
  FlagParser flags;
  flags.Switch("verbose", &parsed.verbose);
  flags.String("name", &parsed.name);
  flags.Int("count", &parsed.count, 0);
  flags.Int("small", &parsed.small, 1);
  flags.List("list", &parsed.list);
  flags.Value(
      "tag",
      [&](absl::string_view v) {
        if (v == "bad") return absl::InvalidArgumentError("--tag \"bad\" is refused");
        parsed.repeated.emplace_back(v);
        return absl::OkStatus();
      },
      /*repeatable=*/true);
  return flags.Parse(args);
}

TEST(FlagParser, ReadsBothSpellingsOfEveryKind) {
  Parsed parsed;
  ASSERT_TRUE(ParseInto(parsed, {"--verbose", "--name=a b", "--count", "42", "--small=3", "--list",
                                 "x,,y", "--tag=1", "--tag", "2"})
                  .ok());
  EXPECT_TRUE(parsed.verbose);
  EXPECT_EQ(parsed.name, "a b");
  EXPECT_EQ(parsed.count, 42);
  EXPECT_EQ(parsed.small, 3);
  EXPECT_EQ(parsed.list, (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(parsed.repeated, (std::vector<std::string>{"1", "2"}));
}

TEST(FlagParser, LeavesDefaultsOfFlagsNotGiven) {
  Parsed parsed;
  parsed.name = "default";
  ASSERT_TRUE(ParseInto(parsed, {}).ok());
  EXPECT_FALSE(parsed.verbose);
  EXPECT_EQ(parsed.name, "default");
}

TEST(FlagParser, EveryMistakeIsOneErrorNamingTheFlag) {
  const struct {
    std::vector<std::string> args;
    const char* message;
  } cases[] = {
      {{"name"}, "unexpected argument \"name\""},
      {{"--bogus=1"}, "unknown flag --bogus"},
      {{"--name=a", "--name", "b"}, "--name is given twice"},
      {{"--verbose", "--verbose"}, "--verbose is given twice"},
      {{"--name"}, "--name needs a value"},
      {{"--name="}, "--name is empty"},
      {{"--name", ""}, "--name is empty"},
      {{"--verbose=yes"}, "--verbose takes no value"},
      {{"--count=-1"}, "--count \"-1\" is not an integer of at least 0"},
      {{"--small", "0"}, "--small \"0\" is not an integer of at least 1"},
      {{"--small=99999999999"}, "--small \"99999999999\" is not an integer"},
      {{"--count=1x"}, "--count \"1x\" is not an integer"},
      {{"--tag=bad"}, "--tag \"bad\" is refused"},
  };
  for (const auto& c : cases) {
    Parsed parsed;
    const absl::Status status = ParseInto(parsed, c.args);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.args[0];
    EXPECT_THAT(std::string(status.message()), HasSubstr(c.message)) << c.args[0];
  }
}

// A mistyped flag names the declared flag a few edits away; a word that is no typo of
// any gets no guess. `Given` tells a flag given from one left at its default.
TEST(FlagParser, SuggestsTheClosestFlagAndRemembersWhatWasGiven) {
  Parsed parsed;
  EXPECT_THAT(std::string(ParseInto(parsed, {"--cuont=1"}).message()),
              HasSubstr("unknown flag --cuont; did you mean --count?"));
  EXPECT_THAT(std::string(ParseInto(parsed, {"--verbos"}).message()),
              HasSubstr("did you mean --verbose?"));
  const std::string unrelated(ParseInto(parsed, {"--zzzzzzzz"}).message());
  EXPECT_THAT(unrelated, HasSubstr("unknown flag --zzzzzzzz"));
  EXPECT_THAT(unrelated, Not(HasSubstr("did you mean")));

  std::string name;
  bool help = false;
  FlagParser flags;
  flags.String("name", &name);
  flags.Switch("h", &help);
  ASSERT_TRUE(flags.Parse(std::vector<std::string>{"-h"}).ok());  // one dash, one letter
  EXPECT_TRUE(help);
  EXPECT_TRUE(flags.Given("h"));
  EXPECT_FALSE(flags.Given("name"));
  EXPECT_FALSE(flags.Parse(std::vector<std::string>{"-name"}).ok());
}

TEST(FlagParser, ParsesMainsArgumentsWithoutTheProgramName) {
  std::string program = "prog", flag = "--count=7";
  char* argv[] = {program.data(), flag.data()};
  int64_t count = 0;
  FlagParser flags;
  flags.Int("count", &count, 0);
  ASSERT_TRUE(flags.Parse(2, argv).ok());
  EXPECT_EQ(count, 7);
}

}  // namespace
}  // namespace torchlens
