// The exemptions on values of every dtype: a complex factor that is all zeros exempts as a
// real one does, scalars compare in their own type (int64 beyond 2^53, complex), and a
// check that cannot run on a value exempts nothing instead of throwing. Expected verdicts
// are hand arithmetic on the values given.
#include "torchlens_dispatch/ops/exemptions.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <vector>

namespace torchlens {
namespace {

std::vector<c10::IValue> Values(std::initializer_list<c10::IValue> values) { return values; }

// x @ zeros(2, 2, dtype=complex64): no value of x changes the product.
TEST(ExemptionsTest, ComplexZeroFactorExemptsTheOtherFactor) {
  const at::Tensor x = at::ones({3, 2}, at::kComplexFloat);
  const at::Tensor zeros = at::zeros({2, 2}, at::kComplexFloat);
  EXPECT_TRUE(ZeroedByAnotherArgument("aten::matmul", {x, zeros}, {0}));
  EXPECT_TRUE(ZeroedByAnotherArgument("aten::mul", {x, zeros}, {0}));
  // Not the zero factor itself, and not a factor whose partner holds 0+1j somewhere.
  EXPECT_FALSE(ZeroedByAnotherArgument("aten::matmul", {x, zeros}, {1}));
  at::Tensor almost = zeros.clone();
  almost[1][0] = c10::complex<float>(0, 1);
  EXPECT_FALSE(ZeroedByAnotherArgument("aten::matmul", {x, almost}, {0}));
}

// clamp(i, 2^53, 2^53 + 1) is no constant: both bounds are one double, not one int64.
TEST(ExemptionsTest, IntegerScalarsCompareAsIntegers) {
  const int64_t two_53 = int64_t{1} << 53;
  const at::Tensor i = at::tensor({two_53 - 5, two_53 + 5});
  const at::Tensor out = at::tensor({two_53, two_53 + 1});
  const std::vector<c10::IValue> args = Values({i, two_53, two_53 + 1});
  EXPECT_FALSE(DataDependentlyExempt("aten::clamp", args, {i}, {0}, {out}));
  const std::vector<c10::IValue> equal = Values({i, two_53, two_53});
  EXPECT_TRUE(DataDependentlyExempt("aten::clamp", equal, {i}, {0}, {at::full({2}, two_53)}));
}

// pow(z, 0j) is all ones, as pow(z, 0) is; pow(z, 1j) is not.
TEST(ExemptionsTest, ComplexExponentZero) {
  const at::Tensor z = at::ones({2}, at::kComplexFloat);
  const at::Tensor ones = at::ones({2}, at::kComplexFloat);
  EXPECT_TRUE(DataDependentlyExempt("aten::pow", Values({z, c10::complex<double>(0, 0)}), {z}, {0},
                                    {ones}));
  EXPECT_FALSE(DataDependentlyExempt("aten::pow", Values({z, c10::complex<double>(0, 1)}), {z}, {0},
                                     {ones}));
}

// index_select from a complex source holding one value everywhere: the indices decide
// nothing. One element differing in its imaginary part makes them decide.
TEST(ExemptionsTest, UniformComplexSource) {
  const at::Tensor source = at::full({4}, c10::complex<double>(1, 2), at::kComplexDouble);
  const at::Tensor index = at::tensor({int64_t{0}, int64_t{3}});
  const std::vector<c10::IValue> args = Values({source, 0, index});
  EXPECT_TRUE(DataDependentlyExempt("aten::index_select", args, {source, index}, {1}, {}));
  at::Tensor mixed = source.clone();
  mixed[2] = c10::complex<double>(1, -2);
  EXPECT_FALSE(DataDependentlyExempt("aten::index_select", Values({mixed, 0, index}),
                                     {mixed, index}, {1}, {}));
}

// A masked_fill whose scalar the tensor cannot hold (a complex value into floats): no
// exemption, and no exception.
TEST(ExemptionsTest, ChecksThatCannotRunExemptNothing) {
  const at::Tensor self = at::zeros({2});
  const at::Tensor mask = at::tensor({1, 0}).to(at::kBool);
  const std::vector<c10::IValue> args = Values({self, mask, c10::complex<double>(0, 1)});
  bool exempt = true;
  EXPECT_NO_THROW(exempt =
                      DataDependentlyExempt("aten::masked_fill", args, {self, mask}, {1}, {self}));
  EXPECT_FALSE(exempt);
}

}  // namespace
}  // namespace torchlens
