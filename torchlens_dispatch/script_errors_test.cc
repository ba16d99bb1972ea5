// Messages as LibTorch 1.13 prints them (copied from its output on the test models).
#include "torchlens_dispatch/script_errors.h"

#include "gtest/gtest.h"

namespace torchlens {
namespace {

constexpr char kLinearFailed[] = R"(The following operation failed in the TorchScript interpreter.
Traceback of TorchScript, serialized code (most recent call last):
  File "code/__torch__.py", line 14, in forward
    act = self.act
    fc1 = self.fc1
    _0 = (fc2).forward((act).forward((fc1).forward(x, ), ), )
                                      ~~~~~~~~~~~~ <--- HERE
    return _0
  File "code/__torch__/torch/nn/modules/linear.py", line 14, in forward
    weight = self.weight
    bias = self.bias
    return torch.linear(input, weight, bias)
           ~~~~~~~~~~~~ <--- HERE

Traceback of TorchScript, original code (most recent call last):
  File "/work/main/tools/gen_testdata.py", line 41, in forward
    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))
                                 ~~~~~~~~ <--- HERE
  File "/usr/lib/python3/dist-packages/torch/nn/modules/linear.py", line 114, in forward
    def forward(self, input: Tensor) -> Tensor:
        return F.linear(input, self.weight, self.bias)
               ~~~~~~~~ <--- HERE
RuntimeError: mat1 and mat2 shapes cannot be multiplied (2x5 and 4x8)
)";

TEST(ParseInterpreterErrorTest, InnermostCauseAndOriginalSourceLine) {
  const ScriptError error = ParseInterpreterError(kLinearFailed);
  EXPECT_EQ(error.cause, "mat1 and mat2 shapes cannot be multiplied (2x5 and 4x8)");
  EXPECT_EQ(error.location,
            "/usr/lib/python3/dist-packages/torch/nn/modules/linear.py:114: "
            "return F.linear(input, self.weight, self.bias)");
  EXPECT_EQ(error.OneLine(),
            "mat1 and mat2 shapes cannot be multiplied (2x5 and 4x8) (at "
            "/usr/lib/python3/dist-packages/torch/nn/modules/linear.py:114: "
            "return F.linear(input, self.weight, self.bias))");
}

TEST(ParseInterpreterErrorTest, ModelsOwnRaiseKeepsItsType) {
  const ScriptError error = ParseInterpreterError(
      R"(The following operation failed in the TorchScript interpreter.
Traceback of TorchScript, serialized code (most recent call last):
  File "code/__torch__.py", line 10, in forward
    _0 = "x must be non-positive, got a positive sum"
    if bool(torch.gt(torch.sum(x), 0)):
      ops.prim.RaiseException(_0, "builtins.ValueError")
      ~~~~~~~~~~~~~~~~~~~~~~~ <--- HERE
    else:
      pass

Traceback of TorchScript, original code (most recent call last):
  File "/tmp/probe/fwd.py", line 5, in forward
    def forward(self, x):
        if x.sum() > 0:
            raise ValueError("x must be non-positive, got a positive sum")
            ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~ <--- HERE
        return x
builtins.ValueError: x must be non-positive, got a positive sum
)");
  EXPECT_EQ(error.cause, "ValueError: x must be non-positive, got a positive sum");
  EXPECT_EQ(
      error.location,
      "/tmp/probe/fwd.py:5: raise ValueError(\"x must be non-positive, got a positive sum\")");
}

TEST(ParseInterpreterErrorTest, SerializedCodeWhenThereIsNoOriginal) {
  const ScriptError error = ParseInterpreterError(
      R"(The following operation failed in the TorchScript interpreter.
Traceback of TorchScript (most recent call last):
  File "code/__torch__.py", line 12, in forward
      pass
    else:
      ops.prim.RaiseException(_0)
      ~~~~~~~~~~~~~~~~~~~~~~~ <--- HERE
    return torch.mul(x, 2)
RuntimeError: AssertionError: expected a 2-D input
)");
  EXPECT_EQ(error.cause, "AssertionError: expected a 2-D input");
  EXPECT_EQ(error.location, "code/__torch__.py:12: ops.prim.RaiseException(_0)");
}

TEST(ParseInterpreterErrorTest, MessageWithoutTracebackIsItsFirstLine) {
  const ScriptError error = ParseInterpreterError(
      "Expected at most 2 argument(s) for operator 'forward', but received 3 argument(s).\n"
      "Declaration: forward(__torch__.Demo self, Tensor x) -> Tensor");
  EXPECT_EQ(error.cause,
            "Expected at most 2 argument(s) for operator 'forward', but received 3 argument(s).");
  EXPECT_EQ(error.location, "");
  EXPECT_EQ(error.OneLine(), error.cause);
}

TEST(ParseCompileErrorTest, FirstLineAndFirstPlace) {
  const ScriptError error = ParseCompileError(R"(
Unknown builtin op: torchvision::nms.
Could not find any similar ops to torchvision::nms. This op may not exist or may not be currently supported in TorchScript.
:
  File "code/__torch__/torchvision/ops/boxes.py", line 6
  _0 = __torch__.torchvision.extension._assert_has_ops
  _1 = _0()
  _2 = ops.torchvision.nms(boxes, scores, iou_threshold)
       ~~~~~~~~~~~~~~~~~~~ <--- HERE
  return _2
'nms' is being compiled since it was called from 'Nms.forward'
  File "/tmp/probe/ops.py", line 4
    def forward(self, boxes, scores):
        return torchvision.ops.nms(boxes, scores, 0.5)
               ~~~~~~~~~~~~~~~~~~~ <--- HERE
)");
  EXPECT_EQ(error.cause, "Unknown builtin op: torchvision::nms.");
  EXPECT_EQ(error.location,
            "code/__torch__/torchvision/ops/boxes.py:6: "
            "_2 = ops.torchvision.nms(boxes, scores, iou_threshold)");
}

}  // namespace
}  // namespace torchlens
