#include "validation/values.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace torchlens {
namespace {

at::Generator& Unused() {
  ADD_FAILURE() << "the first perturbation draws no random numbers";
  static at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(1);
  return generator;
}

// The first perturbation is -1 - value (hand arithmetic), for every floating layout it
// is given, and keeps the value's strides.
TEST(PerturbationTest, FirstIsMinusOneMinusTheValue) {
  const at::Tensor floats = at::tensor({0.5f, -2.0f, 3.0f, 0.0f});
  std::optional<at::Tensor> perturbed = Perturbation(floats, 0, Unused);
  ASSERT_TRUE(perturbed.has_value());
  EXPECT_TRUE(at::equal(*perturbed, at::tensor({-1.5f, 1.0f, -4.0f, -1.0f})));

  const at::Tensor doubles = at::tensor({1.25, -0.5}, at::kDouble);
  perturbed = Perturbation(doubles, 0, Unused);
  ASSERT_TRUE(perturbed.has_value());
  EXPECT_EQ(perturbed->scalar_type(), at::kDouble);
  EXPECT_TRUE(at::equal(*perturbed, at::tensor({-2.25, -0.5}, at::kDouble)));

  // A transposed view: the values follow the view, the strides are the view's.
  const at::Tensor transposed = at::tensor({1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f}).view({2, 3}).t();
  perturbed = Perturbation(transposed, 0, Unused);
  ASSERT_TRUE(perturbed.has_value());
  EXPECT_EQ(perturbed->strides(), transposed.strides());
  EXPECT_TRUE(
      at::equal(*perturbed, at::tensor({-2.0f, -5.0f, -3.0f, -6.0f, -4.0f, -7.0f}).view({3, 2})));

  // Half precision goes through the kernel.
  const at::Tensor halves = at::tensor({2.0f, -1.0f}).to(at::kHalf);
  perturbed = Perturbation(halves, 0, Unused);
  ASSERT_TRUE(perturbed.has_value());
  EXPECT_TRUE(at::equal(*perturbed, at::tensor({-3.0f, 0.0f}).to(at::kHalf)));

  const at::Tensor empty = at::empty({0, 3});
  perturbed = Perturbation(empty, 0, Unused);
  ASSERT_TRUE(perturbed.has_value());
  EXPECT_EQ(perturbed->sizes(), empty.sizes());
}

TEST(PerturbationTest, IntegersAndBoolsDrawNoRandomNumbers) {
  std::optional<at::Tensor> perturbed = Perturbation(at::tensor({3, -1}), 0, Unused);
  ASSERT_TRUE(perturbed.has_value());
  EXPECT_TRUE(at::equal(*perturbed, at::tensor({4, 0})));
  const at::Tensor bools = at::tensor({1, 0}).to(at::kBool);
  perturbed = Perturbation(bools, 0, Unused);
  ASSERT_TRUE(perturbed.has_value());
  EXPECT_TRUE(at::equal(*perturbed, at::tensor({0, 1}).to(at::kBool)));
}

// The random perturbation asks for the generator, and draws from it: the same seed gives
// the same perturbation.
TEST(PerturbationTest, RandomOnesDrawFromTheGivenGenerator) {
  const at::Tensor value = at::tensor({1.0f, -1.0f, 0.5f});
  int asked = 0;
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(7);
  auto seeded = [&]() -> at::Generator& {
    ++asked;
    generator.set_current_seed(7);
    return generator;
  };
  std::optional<at::Tensor> first = Perturbation(value, 2, seeded);
  std::optional<at::Tensor> second = Perturbation(value, 2, seeded);
  ASSERT_TRUE(first.has_value() && second.has_value());
  EXPECT_EQ(asked, 2);
  EXPECT_TRUE(at::equal(*first, *second));
  EXPECT_FALSE(at::equal(*first, value));
}

// Every perturbation of a legitimate value is built without converting an element to a
// double (NOTE [Checks that throw] in validation/op_checks.cc): complex values, half
// precision, infinities and NaN, int64 beyond 2^53 and at its limits, bools, unsigned bytes.
TEST(PerturbationTest, EveryAttemptWorksForEveryDtype) {
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(3);
  auto draw = [&]() -> at::Generator& { return generator; };
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<at::Tensor> values = {
      at::tensor({1.0f, 2.0f}).to(at::kComplexFloat) * c10::complex<double>(1, 2),
      at::zeros({2, 2}, at::kComplexDouble),
      at::tensor({1.0f, -3.0f}).to(at::kHalf),
      at::tensor({1.0f, -3.0f}).to(at::kBFloat16),
      at::tensor({inf, -inf, std::nan("")}),
      at::tensor({int64_t{1} << 53, std::numeric_limits<int64_t>::max()}),
      at::tensor({1, 0}).to(at::kBool),
      at::tensor({0, 255}).to(at::kByte),
      at::ones({2, 3}).t(),  // transposed: the first element of a view
  };
  for (const at::Tensor& value : values) {
    int attempts = 0;
    for (int attempt = 0;; ++attempt) {
      std::optional<at::Tensor> perturbed;
      ASSERT_NO_THROW(perturbed = Perturbation(value, attempt, draw))
          << value.scalar_type() << " attempt " << attempt;
      if (!perturbed.has_value()) break;
      ++attempts;
      EXPECT_EQ(perturbed->scalar_type(), value.scalar_type());
      EXPECT_EQ(perturbed->sizes(), value.sizes());
    }
    EXPECT_GE(attempts, 4) << value.scalar_type();
  }
}

// The perturbation that changes one element changes the first by one in its own dtype:
// -1 - (1+2j) is -2-2j; 2^53 + 1 exists in int64 although no double holds it; int64's
// largest value wraps to its smallest, as int64 arithmetic does.
TEST(PerturbationTest, OneElementChangedInItsOwnDtype) {
  constexpr int kFirstElement = 5;
  const at::Tensor complex =
      at::tensor({1.0, 3.0}).to(at::kComplexDouble) + c10::complex<double>(0, 2);
  std::optional<at::Tensor> perturbed = Perturbation(complex, kFirstElement, Unused);
  ASSERT_TRUE(perturbed.has_value());
  EXPECT_EQ((*perturbed)[0].item<c10::complex<double>>(), c10::complex<double>(-2, -2));
  EXPECT_EQ((*perturbed)[1].item<c10::complex<double>>(), c10::complex<double>(3, 2));

  const int64_t two_53 = int64_t{1} << 53;
  perturbed = Perturbation(at::tensor({two_53, int64_t{7}}), kFirstElement, Unused);
  ASSERT_TRUE(perturbed.has_value());
  EXPECT_EQ((*perturbed)[0].item<int64_t>(), two_53 + 1);
  EXPECT_EQ((*perturbed)[1].item<int64_t>(), 7);

  perturbed =
      Perturbation(at::tensor({std::numeric_limits<int64_t>::max()}), kFirstElement, Unused);
  ASSERT_TRUE(perturbed.has_value());
  EXPECT_EQ((*perturbed)[0].item<int64_t>(), std::numeric_limits<int64_t>::min());

  // A transposed value: the element at index 0 of every dimension.
  const at::Tensor transposed = at::tensor({1.0f, 2.0f, 3.0f, 4.0f}).view({2, 2}).t();
  perturbed = Perturbation(transposed, kFirstElement, Unused);
  ASSERT_TRUE(perturbed.has_value());
  EXPECT_TRUE(at::equal(*perturbed, at::tensor({-2.0f, 3.0f, 2.0f, 4.0f}).view({2, 2})));

  const at::Tensor bools = at::ones({2}, at::kBool);
  perturbed = Perturbation(bools, 3, Unused);
  ASSERT_TRUE(perturbed.has_value());
  EXPECT_TRUE(at::equal(*perturbed, at::tensor({0, 1}).to(at::kBool)));
}

// Half precision's extreme is its largest finite value, not 1e30 (which it cannot hold).
TEST(PerturbationTest, HalfPrecisionExtremeIsFinite) {
  const at::Tensor halves = at::tensor({1.0f}).to(at::kHalf);
  std::optional<at::Tensor> largest = Perturbation(halves, 10, Unused);
  ASSERT_TRUE(largest.has_value());
  EXPECT_EQ(largest->to(at::kFloat).item<float>(), 65504.0f);
}

// Complex values that differ only in their imaginary parts differ by the modulus of their
// difference: |(1+2j) - (1-1j)| = 3.
TEST(DifferenceTest, ComplexValuesDifferInTheirImaginaryParts) {
  const at::Tensor a = at::tensor({1.0, 1.0}).to(at::kComplexFloat) + c10::complex<double>(0, 2);
  const at::Tensor b = at::tensor({1.0, 1.0}).to(at::kComplexFloat) - c10::complex<double>(0, 1);
  std::optional<std::string> diff = Difference(a, b);
  ASSERT_TRUE(diff.has_value());
  EXPECT_EQ(*diff, "max abs difference 3");
}

}  // namespace
}  // namespace torchlens
