// The `torchlens` tool's --edit: each named node set to a value in every element, the
// trace replayed with `Do` (validation/intervene.h), and what changed described.
#ifndef TORCHLENS_TOOLS_CLI_EDITS_H_
#define TORCHLENS_TOOLS_CLI_EDITS_H_

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/trace.h"
#include "tools/cli_flags.h"

namespace torchlens {

// The value every element of `like` takes for `edit`, in `like`'s dtype. A floating or
// complex node takes any number; an integer node an integer only, taken exactly from the
// text (int64 beyond 2^53 too), a bool node 0 or 1. kInvalidArgument names the flag, the
// dtype and what it takes ("--edit bn.num_batches_tracked:1=7.5: the node holds Long
// values, and 7.5 is not an integer").
absl::StatusOr<at::Tensor> EditValue(const at::Tensor& like, const EditFlag& edit);

// Applies the edits (every tensor output of each named node set to its value) and
// describes what changed: the outputs, the buffer versions, and any gap. Errors name the
// --edit flag at fault.
absl::StatusOr<std::string> ApplyEdits(const Trace& trace, const std::vector<EditFlag>& edits);

// "1 node", "2 nodes": `count` and the noun, plural unless `count` is 1.
std::string Count(int64_t count, const std::string& singular, const std::string& plural);

}  // namespace torchlens

#endif  // TORCHLENS_TOOLS_CLI_EDITS_H_
