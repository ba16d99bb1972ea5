// The command-line flags of torchlens' binaries (the `torchlens` tool, the benchmark, the
// example service), declared once per binary and parsed without exiting the process, so
// that every mistake is one kInvalidArgument naming the flag.
//
//   std::string model;
//   bool validate = false;
//   FlagParser flags;
//   flags.String("model", &model);
//   flags.Switch("validate", &validate);
//   absl::Status parsed = flags.Parse(args);  // args without the program name
//
// A flag is "--name=value" or "--name value"; a switch is "--name" alone. Mistakes:
// an argument that is not a flag, an unknown flag, a flag given twice (unless declared
// repeatable: one could silently replace the other), a flag without its value, an empty
// value ("--model=", or an unset shell variable: never "the default"), a switch with a
// value, and whatever a flag's own parser refuses.
#ifndef TORCHLENS_TOOLS_FLAG_PARSER_H_
#define TORCHLENS_TOOLS_FLAG_PARSER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace torchlens {

class FlagParser {
 public:
  // Parses one value; an error's message is the whole error line, so it names the flag.
  using ValueParser = std::function<absl::Status(absl::string_view value)>;

  // "--name" sets `*target` to true.
  void Switch(absl::string_view name, bool* target);
  // "--name V" parsed by `parse`; `repeatable` flags may be given any number of times.
  void Value(absl::string_view name, ValueParser parse, bool repeatable = false);
  // "--name V" stored as it is.
  void String(absl::string_view name, std::string* target);
  // "--name N": an integer at least `min`.
  void Int(absl::string_view name, int64_t* target, int64_t min);
  void Int(absl::string_view name, int* target, int min);
  // "--name a,b,c": the comma-separated list (empty items dropped).
  void List(absl::string_view name, std::vector<std::string>* target);

  // Parses `args` (without the program name), in order. An unknown flag's error names the
  // declared flag closest to it ("did you mean --validate?").
  absl::Status Parse(absl::Span<const std::string> args);
  // The same from main's arguments.
  absl::Status Parse(int argc, char** argv);
  // Whether the last Parse met flag `name` (a flag with a default is told from one given).
  bool Given(absl::string_view name) const { return given_.contains(name); }
  // The flags the last Parse met, in alphabetical order.
  std::vector<std::string> GivenNames() const;

 private:
  struct Flag {
    bool is_switch = false;
    bool repeatable = false;
    ValueParser parse;  // for a switch: called with ""
  };
  void Add(absl::string_view name, Flag flag);
  // The declared flag a mistyped `name` most likely meant, or "".
  std::string ClosestName(absl::string_view name) const;

  absl::flat_hash_map<std::string, Flag> flags_;
  absl::flat_hash_set<std::string> given_;
};

// A path given in a flag, for a binary started by `bazel run`: a relative path is made
// relative to the directory the user ran it from (BUILD_WORKING_DIRECTORY), not to the
// runfiles; absolute paths, empty ones and paths outside `bazel run` stay as they are.
std::string UserPath(const std::string& path);

}  // namespace torchlens

#endif  // TORCHLENS_TOOLS_FLAG_PARSER_H_
