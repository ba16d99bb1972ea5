#include "tools/cli_flags.h"

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace torchlens {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(ParseInputShapes, OneAndSeveralInputs) {
  absl::StatusOr<std::vector<std::vector<int64_t>>> shapes = ParseInputShapes("1,3,224,224");
  ASSERT_TRUE(shapes.ok()) << shapes.status();
  EXPECT_THAT(*shapes, ElementsAre(ElementsAre(1, 3, 224, 224)));
  shapes = ParseInputShapes("1, 16;2,4");
  ASSERT_TRUE(shapes.ok()) << shapes.status();
  EXPECT_THAT(*shapes, ElementsAre(ElementsAre(1, 16), ElementsAre(2, 4)));
}

TEST(ParseInputShapes, RejectsBadShapes) {
  for (const char* bad :
       {"", "1,,2", "1,x", "-1,3", "1;", "1.5", "99999999999999", "+3", "65536,65536"}) {
    absl::StatusOr<std::vector<std::vector<int64_t>>> shapes = ParseInputShapes(bad);
    EXPECT_EQ(shapes.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(shapes.status().message()), HasSubstr("--input_shape")) << bad;
  }
  // A dimension too long to be a size is said to be too large, not "not an integer".
  EXPECT_THAT(std::string(ParseInputShapes("9223372036854775807,2").status().message()),
              HasSubstr("is too large"));
}

TEST(ParseEdit, LabelAndValue) {
  absl::StatusOr<EditFlag> edit = ParseEdit("relu_1_2:1=5");
  ASSERT_TRUE(edit.ok()) << edit.status();
  EXPECT_EQ(edit->label, "relu_1_2:1");
  EXPECT_EQ(edit->value, 5.0);
  edit = ParseEdit("bn.running_mean:1=-0.25");
  ASSERT_TRUE(edit.ok()) << edit.status();
  EXPECT_EQ(edit->label, "bn.running_mean:1");
  EXPECT_EQ(edit->value, -0.25);
}

TEST(ParseEdit, RejectsBadEdits) {
  for (const char* bad : {"", "=", "relu=", "=5", "relu_1_2:1=x", "relu 1=2", "a:0=1"}) {
    EXPECT_EQ(ParseEdit(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(ParseCommandLine, FlagsWithAndWithoutEquals) {
  absl::StatusOr<CliOptions> options = ParseCommandLine(
      {"--model=m.pt", "--input_shape", "2,3", "--mode", "train", "--seed=5", "--no_save"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->model, "m.pt");
  EXPECT_THAT(options->input_shapes, ElementsAre(ElementsAre(2, 3)));
  EXPECT_TRUE(options->train);
  EXPECT_EQ(options->seed, 5);
  EXPECT_FALSE(options->save_activations);
}

TEST(ParseCommandLine, RejectsMistakes) {
  const std::vector<std::vector<std::string>> bad = {{"--bogus"},
                                                     {"model.pt"},
                                                     {"--model"},
                                                     {"--mode=fast"},
                                                     {"--seed=x"},
                                                     {"--no_save=1"},
                                                     {"--render=graph.txt"},
                                                     {"--input=a.pt", "--input_shape=1"}};
  for (const std::vector<std::string>& args : bad) {
    absl::StatusOr<CliOptions> options = ParseCommandLine(args);
    EXPECT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument) << args[0];
  }
  EXPECT_THAT(std::string(ParseCommandLine({"--bogus"}).status().message()),
              HasSubstr("unknown flag --bogus"));
}

// Flags that only say how to draw are refused without --render, naming each one given.
TEST(ParseCommandLine, RenderOnlyFlagsNeedRender) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--rolled"}, {"--render_depth=2"}, {"--show_buffers=always"}}) {
    absl::StatusOr<CliOptions> options = ParseCommandLine(args);
    EXPECT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument) << args[0];
    EXPECT_THAT(std::string(options.status().message()),
                HasSubstr(absl::StrCat(args[0].substr(0, args[0].find('=')), " says how to draw")));
  }
  absl::StatusOr<CliOptions> options =
      ParseCommandLine({"--render=g.svg", "--rolled", "--render_depth=2", "--show_buffers=never"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_TRUE(options->rolled);
  EXPECT_EQ(options->render_depth, 2);
  EXPECT_EQ(options->show_buffers, "never");
}

// An edit keeps its value's text, so that an integer node takes it exactly.
TEST(ParseEdit, KeepsTheValueAsGiven) {
  absl::StatusOr<EditFlag> edit = ParseEdit("counter:1=9007199254740993");
  ASSERT_TRUE(edit.ok()) << edit.status();
  EXPECT_EQ(edit->text, "9007199254740993");
}

TEST(ParseCommandLine, TraceFileTakesNoCaptureFlags) {
  absl::StatusOr<CliOptions> options =
      ParseCommandLine({"--trace", "a.pt", "--compare=b.pt", "--validate", "--module=fc"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->trace_file, "a.pt");
  EXPECT_EQ(options->compare_trace, "b.pt");
  for (const std::vector<std::string>& capture :
       std::vector<std::vector<std::string>>{{"--seed=1"},
                                             {"--mode=train"},
                                             {"--model=m.pt"},
                                             {"--input_shape=1,3"},
                                             {"--no_save"},
                                             {"--halt_after=fc"},
                                             {"--max_saved_bytes=10"},
                                             {"--stream_to=s.pt"}}) {
    std::vector<std::string> args = {"--trace=a.pt"};
    args.insert(args.end(), capture.begin(), capture.end());
    absl::StatusOr<CliOptions> refused = ParseCommandLine(args);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << capture[0];
    const std::string flag = capture[0].substr(0, capture[0].find('='));
    EXPECT_THAT(std::string(refused.status().message()),
                HasSubstr(absl::StrCat("--trace reads a saved trace, but ", flag, " describes")))
        << capture[0];
  }
}

// --stream_to (CaptureOptions::trace_file) keeps every value: flags that save fewer, or
// none, or save a second file are refused.
TEST(ParseCommandLine, StreamToKeepsEveryValue) {
  absl::StatusOr<CliOptions> options =
      ParseCommandLine({"--stream_to", "s.pt", "--mode=train", "--halt_after=fc", "--validate"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->stream_file, "s.pt");
  for (const std::vector<std::string>& saving :
       std::vector<std::vector<std::string>>{{"--save=t.pt"},
                                             {"--no_save"},
                                             {"--save_modules=fc"},
                                             {"--save_types=relu"},
                                             {"--save_labels=relu_1_2:1"},
                                             {"--max_saved_bytes=10"}}) {
    std::vector<std::string> args = {"--stream_to=s.pt"};
    args.insert(args.end(), saving.begin(), saving.end());
    absl::StatusOr<CliOptions> refused = ParseCommandLine(args);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << saving[0];
    EXPECT_THAT(std::string(refused.status().message()),
                HasSubstr(absl::StrCat("cannot be combined with ",
                                       saving[0].substr(0, saving[0].find('=')))))
        << saving[0];
  }
}

TEST(ParseCommandLine, EmptyValuesAreErrors) {
  // An empty value (an unset shell variable) must not fall back to the default: "--model="
  // used to trace the bundled demo model.
  for (const char* flag : {"model", "input", "input_shape", "summary", "render", "json", "save",
                           "mode", "seed", "show_buffers", "edit"}) {
    for (const std::vector<std::string>& args :
         {std::vector<std::string>{absl::StrCat("--", flag, "=")},
          std::vector<std::string>{absl::StrCat("--", flag), ""}}) {
      absl::StatusOr<CliOptions> options = ParseCommandLine(args);
      EXPECT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument) << flag;
      EXPECT_THAT(std::string(options.status().message()),
                  HasSubstr(absl::StrCat("--", flag, " is empty")))
          << flag;
    }
  }
}

TEST(ParseCommandLine, RepeatedFlagsAreErrorsExceptEdit) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--model=a.pt", "--model=b.pt"},
        std::vector<std::string>{"--json", "a.json", "--json=b.json"},
        std::vector<std::string>{"--validate", "--validate"},
        std::vector<std::string>{"--input_shape=1", "--input_shape=2"}}) {
    absl::StatusOr<CliOptions> options = ParseCommandLine(args);
    EXPECT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument) << args[0];
    EXPECT_THAT(std::string(options.status().message()), HasSubstr("is given twice")) << args[0];
  }
  absl::StatusOr<CliOptions> edits =
      ParseCommandLine({"--edit", "relu_1_2:1=5", "--edit=linear_1_1:1=-1"});
  ASSERT_TRUE(edits.ok()) << edits.status();
  ASSERT_EQ(edits->edits.size(), 2u);
  EXPECT_EQ(edits->edits[0].label, "relu_1_2:1");
  EXPECT_EQ(edits->edits[1].value, -1.0);
}

TEST(ParseCommandLine, ServiceCaptureFlags) {
  absl::StatusOr<CliOptions> options = ParseCommandLine(
      {"--save_modules=layer4,fc", "--save_types", "conv2d", "--save_labels", "relu_1_2:1",
       "--halt_after", "layer1", "--max_saved_bytes=1000", "--partial_on_budget"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->save_modules, (std::vector<std::string>{"layer4", "fc"}));
  EXPECT_EQ(options->save_types, (std::vector<std::string>{"conv2d"}));
  EXPECT_EQ(options->save_labels, (std::vector<std::string>{"relu_1_2:1"}));
  EXPECT_EQ(options->halt_after, "layer1");
  EXPECT_EQ(options->max_saved_bytes, 1000);
  EXPECT_TRUE(options->partial_on_budget);
  EXPECT_THAT(std::string(ParseCommandLine({"--max_saved_bytes=-1"}).status().message()),
              HasSubstr("--max_saved_bytes \"-1\" is not an integer of at least 0"));
  EXPECT_THAT(std::string(ParseCommandLine({"--partial_on_budget"}).status().message()),
              HasSubstr("needs --max_saved_bytes"));
}

}  // namespace
}  // namespace torchlens
