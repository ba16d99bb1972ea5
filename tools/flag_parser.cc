#include "tools/flag_parser.h"

#include <cassert>
#include <cstdlib>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace torchlens {
namespace {

template <typename Integer>
FlagParser::ValueParser IntParser(absl::string_view name, Integer* target, Integer min) {
  return [name = std::string(name), target, min](absl::string_view value) {
    Integer parsed = 0;
    if (!absl::SimpleAtoi(value, &parsed) || parsed < min) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, " \"", value, "\" is not an integer of at least ", min));
    }
    *target = parsed;
    return absl::OkStatus();
  };
}

}  // namespace

void FlagParser::Add(absl::string_view name, Flag flag) {
  const bool inserted = flags_.emplace(std::string(name), std::move(flag)).second;
  assert(inserted && "a flag declared twice");
  (void)inserted;
}

void FlagParser::Switch(absl::string_view name, bool* target) {
  Add(name, Flag{/*is_switch=*/true, /*repeatable=*/false, [target](absl::string_view) {
                   *target = true;
                   return absl::OkStatus();
                 }});
}

void FlagParser::Value(absl::string_view name, ValueParser parse, bool repeatable) {
  Add(name, Flag{/*is_switch=*/false, repeatable, std::move(parse)});
}

void FlagParser::String(absl::string_view name, std::string* target) {
  Value(name, [target](absl::string_view value) {
    *target = std::string(value);
    return absl::OkStatus();
  });
}

void FlagParser::Int(absl::string_view name, int64_t* target, int64_t min) {
  Value(name, IntParser(name, target, min));
}

void FlagParser::Int(absl::string_view name, int* target, int min) {
  Value(name, IntParser(name, target, min));
}

void FlagParser::List(absl::string_view name, std::vector<std::string>* target) {
  Value(name, [target](absl::string_view value) {
    *target = absl::StrSplit(value, ',', absl::SkipEmpty());
    return absl::OkStatus();
  });
}

absl::Status FlagParser::Parse(absl::Span<const std::string> args) const {
  absl::flat_hash_set<std::string> seen;
  for (size_t i = 0; i < args.size(); ++i) {
    absl::string_view arg = args[i];
    if (!absl::ConsumePrefix(&arg, "--")) {
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected argument \"", args[i], "\"; flags start with -- (see --help)"));
    }
    std::string name(arg);
    std::optional<std::string> value;
    if (const size_t eq = arg.find('='); eq != absl::string_view::npos) {
      name = std::string(arg.substr(0, eq));
      value = std::string(arg.substr(eq + 1));
    }
    const auto it = flags_.find(name);
    if (it == flags_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag --", name, "; run with --help for the flags"));
    }
    const Flag& flag = it->second;
    if (!flag.repeatable && !seen.insert(name).second) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, " is given twice; give it once"));
    }
    if (flag.is_switch) {
      if (value.has_value()) {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " takes no value"));
      }
      value = "";
    } else {
      if (!value.has_value()) {
        if (i + 1 >= args.size()) {
          return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
        }
        value = args[++i];
      }
      if (value->empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", name, " is empty; give a value or leave the flag out"));
      }
    }
    if (absl::Status parsed = flag.parse(*value); !parsed.ok()) {
      return absl::InvalidArgumentError(parsed.message());
    }
  }
  return absl::OkStatus();
}

std::string UserPath(const std::string& path) {
  const char* cwd = std::getenv("BUILD_WORKING_DIRECTORY");
  if (path.empty() || path[0] == '/' || cwd == nullptr) return path;
  return absl::StrCat(cwd, "/", path);
}

absl::Status FlagParser::Parse(int argc, char** argv) const {
  std::vector<std::string> args(argv + 1, argv + argc);
  return Parse(args);
}

}  // namespace torchlens
