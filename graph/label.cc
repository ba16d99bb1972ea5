#include "graph/label.h"

#include <cctype>
#include <charconv>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace torchlens {
namespace {

constexpr absl::string_view kKeyForms =
    "expected a label such as \"relu_1_2:1\" or \"relu_1_2\", a buffer address such as "
    "\"bn.running_mean:2\", or \"input_1\"";

absl::Status Malformed(absl::string_view key, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("malformed key \"", absl::CEscape(key), "\": ", why, "; ", kKeyForms));
}

}  // namespace

absl::StatusOr<ParsedKey> ParseKey(absl::string_view key) {
  if (key.empty()) return Malformed(key, "it is empty");
  for (char c : key) {
    if (std::isspace(static_cast<unsigned char>(c)) ||
        std::iscntrl(static_cast<unsigned char>(c))) {
      return Malformed(key, "it contains whitespace or a control character");
    }
  }
  ParsedKey parsed;
  const size_t colon = key.rfind(':');
  if (colon == absl::string_view::npos) {
    parsed.base = std::string(key);
    return parsed;
  }
  absl::string_view base = key.substr(0, colon);
  absl::string_view pass = key.substr(colon + 1);
  if (base.empty()) return Malformed(key, "nothing precedes ':'");
  if (base.find(':') != absl::string_view::npos) return Malformed(key, "it has more than one ':'");
  if (pass.empty()) return Malformed(key, "nothing follows ':'");
  for (char c : pass) {
    if (c < '0' || c > '9') return Malformed(key, "the pass after ':' is not a decimal number");
  }
  int value = 0;
  if (pass.size() > 9 || !absl::SimpleAtoi(pass, &value) || value < 1) {
    return Malformed(key, "the pass after ':' must be a number from 1");
  }
  parsed.base = std::string(base);
  parsed.pass = value;
  return parsed;
}

std::string PassLabel(absl::string_view base, int pass) { return absl::StrCat(base, ":", pass); }

namespace {

// `prefix` then each of `numbers` after its separator: "relu" {'_', 1}, {'_', 2}, {':', 3}
// gives "relu_1_2:3".
struct Numbered {
  char separator;
  int number;
};
template <size_t N>
std::string Label(absl::string_view prefix, const Numbered (&numbers)[N]) {
  char text[N * 12];  // a separator and at most 11 characters of an int each
  char* end = text;
  for (const Numbered& n : numbers) {
    *end++ = n.separator;
    end = std::to_chars(end, text + sizeof(text), n.number).ptr;
  }
  std::string label;
  label.reserve(prefix.size() + static_cast<size_t>(end - text));
  label.append(prefix.data(), prefix.size()).append(text, end);
  return label;
}

}  // namespace

std::string LayerPassLabel(absl::string_view type, int type_index, int step_index, int pass) {
  return Label(type, {{'_', type_index}, {'_', step_index}, {':', pass}});
}

std::string BufferPassLabel(int number, int pass) {
  return Label("buffer", {{'_', number}, {':', pass}});
}

}  // namespace torchlens
