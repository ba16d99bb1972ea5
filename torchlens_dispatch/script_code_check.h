// Checking the TorchScript code of a model archive for what LibTorch 1.13's importer
// relies on without checking.
//
// NOTE [Code LibTorch 1.13 crashes on]
// torch::jit::load compiles the code records (`code/**.py`) of an archive. LibTorch 1.13
// takes a class-level assignment with a value for a class constant and reads its type
// annotation (`x : Final[int] = 3`) without checking that there is one: a class body
// holding `x = 3` reads uninitialized memory and, depending on what the heap held,
// crashes (found by fuzzing: one changed byte turned `__buffers__ = []` into
// `__btffers__ = []`; later PyTorch versions check it). `CheckScriptCode` parses each code
// record with LibTorch's own parser first and refuses such a class, naming it and the
// line. Everything else in the code is left to LibTorch, whose other failures are
// exceptions (README "Limitations").
#ifndef TORCHLENS_DISPATCH_SCRIPT_CODE_CHECK_H_
#define TORCHLENS_DISPATCH_SCRIPT_CODE_CHECK_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace torchlens {

// kInvalidArgument for code LibTorch cannot parse (its own message: the cause and the
// line), nested past what it can recurse over (NOTE [Code LibTorch recurses over] in the
// .cc), or for the class constants above; `filename` names the record in messages. Adds
// the number of functions and methods the code defines to `*functions` when given (NOTE
// [Calls LibTorch compiles by recursion] in large_stack.h).
absl::Status CheckScriptCode(absl::string_view code, const std::string& filename,
                             int64_t* functions = nullptr);

// NOTE [Printing debug information]
// LibTorch formats the original source of an error inside the noexcept
// `ErrorReport::what()` (NOTE [Debug information] in graph/archive_check.cc): an exception
// there ends the process. Its text iterators assert on ranges that a well-formed record
// can still hold (fuzzing: a range ending in an empty piece of text). `CheckDebugInfo`
// therefore prints every source range of a debug record (`code/**.debug_pkl`, already
// checked by CheckTorchArchive) the way the error would, with LibTorch's own code, where
// a throw is only a refusal.
absl::Status CheckDebugInfo(absl::string_view pickle, const std::string& filename);

}  // namespace torchlens

#endif  // TORCHLENS_DISPATCH_SCRIPT_CODE_CHECK_H_
