// Parsing of the keys `Trace::Find` accepts.
//
// A key is a base name with an optional pass: "relu_1_2:1", "relu_1_2", "bn.running_mean:2",
// "h", "buffer_1:3", "input_1". The base is what precedes the last ':'; the pass, when
// present, is a positive decimal number. Parsing is purely syntactic: whether the base
// names a layer, a buffer address or an input is for the trace to decide.
#ifndef TORCHLENS_GRAPH_LABEL_H_
#define TORCHLENS_GRAPH_LABEL_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace torchlens {

struct ParsedKey {
  std::string base;         // "relu_1_2", "bn.running_mean"
  std::optional<int> pass;  // 1-based; nullopt when the key has no ":N"
};

// kInvalidArgument (saying what is wrong and what a key looks like) for an empty key,
// whitespace or control characters, an empty base, or a pass that is not a positive
// decimal number that fits in an int.
absl::StatusOr<ParsedKey> ParseKey(absl::string_view key);

// "relu_1_2:3" from a base and a pass.
std::string PassLabel(absl::string_view base, int pass);
// "relu_1_2:3" from a layer's type, its two indices and a pass: PassLabel of the layer's
// base name, built without temporaries, in one allocation at most (none when it fits in
// std::string's inline buffer): the trace builder labels every op with it.
std::string LayerPassLabel(absl::string_view type, int type_index, int step_index, int pass);
// "buffer_2:3" from a buffer's number and a pass, likewise.
std::string BufferPassLabel(int number, int pass);

}  // namespace torchlens

#endif  // TORCHLENS_GRAPH_LABEL_H_
