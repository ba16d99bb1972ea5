// The cause and the source line in a TorchScript error, for one-line messages.
//
// LibTorch's TorchScript errors are many lines long and start with the least useful one:
// a failing forward says "The following operation failed in the TorchScript interpreter."
// and puts the cause ("RuntimeError: mat1 and mat2 shapes cannot be multiplied (2x5 and
// 4x8)") last, after a traceback of the serialized code and, when the archive carries
// debug information, of the original Python code. A compile error (an unknown operator)
// puts the cause first and the place after it.
//
//   ScriptError error = ParseInterpreterError(e.what());
//   // error.cause == "mat1 and mat2 shapes cannot be multiplied (2x5 and 4x8)"
//   // error.location == "/usr/lib/python3/dist-packages/torch/nn/modules/linear.py:114:
//   //                   return F.linear(input, self.weight, self.bias)"
#ifndef TORCHLENS_DISPATCH_SCRIPT_ERRORS_H_
#define TORCHLENS_DISPATCH_SCRIPT_ERRORS_H_

#include <string>

#include "absl/strings/string_view.h"

namespace torchlens {

struct ScriptError {
  // The error itself, without LibTorch's generic "RuntimeError: " prefix; a Python
  // exception the model raised keeps its type ("ValueError: x must be positive").
  std::string cause;
  // "file:line: source line" of the innermost frame, from the original code when the
  // archive has it, else from the serialized code; empty when the message names none.
  std::string location;

  // "cause (at location)", or the cause alone.
  std::string OneLine() const;
};

// A failure inside the interpreter (a forward that threw). A message without a
// traceback gives its first line as the cause.
ScriptError ParseInterpreterError(absl::string_view message);

// A `torch::jit::ErrorReport` (compiling the archive's code failed): its first line,
// and the first place it shows.
ScriptError ParseCompileError(absl::string_view message);

}  // namespace torchlens

#endif  // TORCHLENS_DISPATCH_SCRIPT_ERRORS_H_
