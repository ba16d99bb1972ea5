#include "torchlens_dispatch/ops/exception_text.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/jit/frontend/error_report.h>
#include <torch/csrc/jit/frontend/source_range.h>
#include <torch/csrc/jit/serialization/source_range_serialization.h>

#include <memory>
#include <new>
#include <stdexcept>
#include <string>

namespace torchlens {
namespace {

// The message LibTorch's CPU allocator throws, caught from a real allocation of 4 TiB.
TEST(ExceptionTextTest, AnAllocationLibTorchCannotMakeIsOutOfMemory) {
  try {
    at::Tensor huge = at::empty({int64_t{1} << 40}, at::kFloat);
    GTEST_SKIP() << "this machine allocated 4 TiB";
  } catch (const c10::Error& e) {
    EXPECT_TRUE(IsOutOfMemory(e)) << e.what_without_backtrace();
    EXPECT_NE(FirstLine(e).find("DefaultCPUAllocator: can't allocate memory"), std::string::npos)
        << FirstLine(e);
  }
  EXPECT_TRUE(IsOutOfMemory(std::bad_alloc()));
}

TEST(ExceptionTextTest, OtherErrorsAreNotOutOfMemoryEvenWhenTheyMentionAllocating) {
  try {
    (void)at::mm(at::ones({2, 3}), at::ones({2, 3}));
    FAIL() << "mm accepted mismatched shapes";
  } catch (const c10::Error& e) {
    EXPECT_FALSE(IsOutOfMemory(e)) << e.what_without_backtrace();
  }
  EXPECT_FALSE(IsOutOfMemory(std::runtime_error("cannot allocate a buffer of rank 3 here")));
  // The interpreter wraps the allocator's message in its own: still out of memory.
  EXPECT_TRUE(IsOutOfMemory(std::runtime_error(
      "The following operation failed in the TorchScript interpreter.\n"
      "RuntimeError: DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes")));
}

TEST(ExceptionTextTest, FirstLineDropsLibTorchsBacktrace) {
  try {
    (void)at::mm(at::ones({2, 3}), at::ones({2, 3}));
  } catch (const c10::Error& e) {
    EXPECT_EQ(FirstLine(e), "mat1 and mat2 shapes cannot be multiplied (2x3 and 2x3)");
  }
}

// Debug information that fails to unpickle when LibTorch first looks a line up in it.
class CorruptDebugInformation : public torch::jit::SourceRangeUnpickler {
 public:
  c10::optional<torch::jit::SourceRange> findSourceRangeThatGenerated(
      const torch::jit::SourceRange&) override {
    throw std::runtime_error("corrupt debug information");
  }
};

// A compile error raised while `helper` was compiled for `forward`, in archive code whose
// debug information is corrupt: what torch::jit::load throws for such an archive.
torch::jit::ErrorReport CompileErrorWithCorruptDebugInformation() {
  auto code = std::make_shared<torch::jit::Source>("def forward(self, x):\n    return helper(x)\n",
                                                   "code/__torch__/m.py", 1,
                                                   std::make_shared<CorruptDebugInformation>());
  const torch::jit::SourceRange call(code, 26, 42);  // "return helper(x)"
  torch::jit::ErrorReport::CallStack forward("forward", call);
  torch::jit::ErrorReport::CallStack helper("helper", call);
  torch::jit::ErrorReport report(call);
  report << "Unknown builtin op: aten::nope";
  return report;
}

// NOTE [ErrorReport::what() ends the process]: the premise, then MessageOf's answer.
TEST(ExceptionTextDeathTest, ErrorReportsOwnWhatEndsTheProcessOnCorruptDebugInformation) {
  const torch::jit::ErrorReport report = CompileErrorWithCorruptDebugInformation();
  EXPECT_DEATH((void)report.what(), "");
}

TEST(ExceptionTextTest, MessageOfAnErrorReportSurvivesCorruptDebugInformation) {
  const torch::jit::ErrorReport report = CompileErrorWithCorruptDebugInformation();
  const std::string message = MessageOf(report);
  EXPECT_EQ(FirstLine(report), "Unknown builtin op: aten::nope:");  // as what() writes it
  EXPECT_NE(message.find("'helper' is being compiled since it was called from 'forward'"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("(the original source of this line is unavailable: corrupt debug "
                         "information)"),
            std::string::npos)
      << message;
  // The serialized line is still shown, with its place.
  EXPECT_NE(message.find("File \"code/__torch__/m.py\", line 2"), std::string::npos) << message;
  EXPECT_NE(message.find("    return helper(x)\n    ~~~~~~~~~~~~~~~~ <--- HERE"), std::string::npos)
      << message;
}

TEST(ExceptionTextTest, MessageOfAnErrorReportMatchesWhatWhenNothingThrows) {
  auto code = std::make_shared<torch::jit::Source>("def f(x):\n    return g(x)\n",
                                                   "code/__torch__/m.py", 1);
  const torch::jit::SourceRange call(code, 21, 25);  // "g(x)"
  torch::jit::ErrorReport::CallStack outer("forward", call);
  torch::jit::ErrorReport::CallStack inner("f", call);
  torch::jit::ErrorReport report(call);
  report << "undefined value g";
  EXPECT_EQ(MessageOf(report), std::string(report.what()));
}

}  // namespace
}  // namespace torchlens
