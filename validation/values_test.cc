#include "validation/values.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace torchlens
