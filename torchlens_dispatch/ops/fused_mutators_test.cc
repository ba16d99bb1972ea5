// The fused-mutator table resolves its argument names against LibTorch's own schemas.
#include "torchlens_dispatch/ops/fused_mutators.h"

#include <string>

#include "gtest/gtest.h"

namespace torchlens {
namespace {

TEST(FusedMutatorsTest, PositionsComeFromTheRegisteredSchemas) {
  // batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps,
  // cudnn_enabled) in LibTorch 1.13; instance_norm has use_input_stats where training is,
  // but writes its statistics back whatever it says.
  for (const char* name : {"aten::batch_norm", "aten::_batch_norm_impl_index",
                           "aten::native_batch_norm", "aten::instance_norm"}) {
    SCOPED_TRACE(name);
    const FusedMutator* mutator = FindFusedMutator(name);
    ASSERT_NE(mutator, nullptr);
    EXPECT_EQ(mutator->state_arguments[0], 3);
    EXPECT_EQ(mutator->state_arguments[1], 4);
    EXPECT_EQ(mutator->update_flag_argument, std::string(name) == "aten::instance_norm" ? -1 : 5);
    EXPECT_TRUE(IsStateArgument(*mutator, 4));
    EXPECT_FALSE(IsStateArgument(*mutator, 0));
  }
  EXPECT_EQ(FindFusedMutator("aten::layer_norm"), nullptr);
}

TEST(FusedMutatorsTest, UpdateFlagIsReadFromTheCall) {
  const FusedMutator* mutator = FindFusedMutator("aten::batch_norm");
  ASSERT_NE(mutator, nullptr);
  std::vector<c10::IValue> args(9);
  args[5] = true;
  EXPECT_TRUE(UpdatesState(*mutator, args));
  args[5] = false;
  EXPECT_FALSE(UpdatesState(*mutator, args));
  EXPECT_FALSE(UpdatesState(*mutator, std::vector<c10::IValue>(3)));  // too few arguments
}

TEST(FusedMutatorsTest, BatchNormUpdateStatsAlwaysUpdates) {
  // batch_norm_update_stats(input, running_mean, running_var, momentum): no flag.
  const FusedMutator* mutator = FindFusedMutator("aten::batch_norm_update_stats");
  ASSERT_NE(mutator, nullptr);
  EXPECT_EQ(mutator->state_arguments[0], 1);
  EXPECT_EQ(mutator->state_arguments[1], 2);
  EXPECT_EQ(mutator->update_flag_argument, -1);
  EXPECT_TRUE(UpdatesState(*mutator, std::vector<c10::IValue>(4)));
}

}  // namespace
}  // namespace torchlens
