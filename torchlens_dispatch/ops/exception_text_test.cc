#include "torchlens_dispatch/ops/exception_text.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace torchlens
