// What LibTorch 1.13's importer relies on in code and debug records, checked first.
#include "torchlens_dispatch/script_code_check.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace torchlens {
namespace {

using ::testing::HasSubstr;

constexpr char kModule[] = R"(class Net(Module):
  __parameters__ = []
  __buffers__ = []
  training : bool
  scale : Final[int] = 2
  def forward(self: __torch__.Net,
    x: Tensor) -> Tensor:
    return torch.mul(x, 2)
)";

TEST(CheckScriptCodeTest, ModulesAsTorchScriptWritesThemPass) {
  EXPECT_TRUE(CheckScriptCode(kModule, "code/__torch__.py").ok());
  EXPECT_TRUE(CheckScriptCode("def helper(x: Tensor) -> Tensor:\n  return x\n", "code/f.py").ok());
}

// LibTorch 1.13 reads uninitialized memory for the missing annotation (fuzzing turned
// "__buffers__ = []" into "__btffers__ = []").
TEST(CheckScriptCodeTest, ClassConstantsWithoutATypeAreRefused) {
  std::string code = kModule;
  code.replace(code.find("__buffers__"), 11, "__btffers__");
  const absl::Status status = CheckScriptCode(code, "code/__torch__.py");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("class Net at code/__torch__.py:3 gives '__btffers__' a value without a "
                        "type"));
}

TEST(CheckScriptCodeTest, SyntaxErrorsAreLibTorchsOwnMessage) {
  const absl::Status status =
      CheckScriptCode("class Net(Module):\n  def forward(self, x):\n    return (x\n", "code/a.py");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("expected ) but found 'eof' here: (at code/a.py:4)"));
}

// Text pieces where LibTorch's line search steps onto an empty piece: its iterator asserts
// while building the source, inside the noexcept ErrorReport::what() (fuzzing).
// NOTE [Code LibTorch recurses over]: each of these overflowed the stack in LibTorch's
// parser, or while its tree was freed (a helper's review, 2026-12-06); each is refused
// before anything parses it, naming the line.
TEST(CheckScriptCodeTest, CodeNestedPastWhatTheParserCanRecurseIsRefused) {
  auto refused = [](const std::string& body) {
    const absl::Status status = CheckScriptCode(
        "def f(x: Tensor) -> Tensor:\n  y = x\n  return " + body + "\n", "code/__torch__/deep.py");
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    return std::string(status.message());
  };
  EXPECT_THAT(refused(std::string(200000, '(') + "x" + std::string(200000, ')')),
              HasSubstr("code/__torch__/deep.py line 3: brackets nest more than 256 deep"));
  std::string nots, chain = "x", powers = "x";
  for (int i = 0; i < 100000; ++i) nots += "not ";
  for (int i = 0; i < 1000000; ++i) chain += " + x";
  for (int i = 0; i < 100000; ++i) powers += " ** x";
  EXPECT_THAT(refused(nots + "x"), HasSubstr("more than 1,024 operators in one statement"));
  EXPECT_THAT(refused(chain), HasSubstr("line 3: more than 1,024 operators"));
  EXPECT_THAT(refused(powers), HasSubstr("more than 1,024 operators"));
  std::string blocks = "def f(x: Tensor) -> Tensor:\n";
  for (int depth = 1; depth <= 300; ++depth) {
    blocks += std::string(depth, ' ') + "if bool(x):\n";
  }
  blocks += std::string(301, ' ') + "x = x\n  return x\n";
  const absl::Status deep_blocks = CheckScriptCode(blocks, "code/b.py");
  EXPECT_THAT(std::string(deep_blocks.message()), HasSubstr("blocks nest more than 256 deep"));
  // What TorchScript prints: wide, not deep.
  std::string wide = "torch.cat([x";
  for (int i = 0; i < 5000; ++i) wide += ", x";
  EXPECT_TRUE(
      CheckScriptCode("def f(x: Tensor) -> Tensor:\n  return " + wide + "])\n", "code/w.py").ok());
}

TEST(CheckDebugInfoTest, SourcesLibTorchCannotPrintAreRefused) {
  auto debug_info = [](const std::string& first_piece) {
    using std::string_literals::operator""s;
    // ("FORMAT_WITH_STRING_TABLE", (first_piece, "", "f.py"),
    //  ((0, ((build_intlist([0, 1]), 2, 1), 0, 3), 0),))
    std::string out =
        "\x80\x02X\x18\x00\x00\x00"
        "FORMAT_WITH_STRING_TABLE(X"s;
    out.push_back(static_cast<char>(first_piece.size()));
    out += "\x00\x00\x00"s + first_piece + "X\x00\x00\x00\x00"s +
           "X\x04\x00\x00\x00"
           "f.py"
           "t((K\x00"s +
           "ctorch.jit._pickle\nbuild_intlist\n(](K\x00"
           "K\x01"
           "etRK\x02"
           "K\x01\x87"s +
           "K\x00"
           "K\x03\x87K\x00"
           "tt\x87."s;
    return out;
  };
  // As LibTorch writes it: the empty piece last, after a line end.
  const absl::Status good = CheckDebugInfo(debug_info("def f(x):\n"), "code/f.py.debug_pkl");
  EXPECT_TRUE(good.ok()) << good;
  const absl::Status bad = CheckDebugInfo(debug_info("def f(x):"), "code/f.py.debug_pkl");
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.message()),
              HasSubstr("code/f.py.debug_pkl: debug information LibTorch cannot print"));
}

}  // namespace
}  // namespace torchlens
