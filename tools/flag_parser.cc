#include "tools/flag_parser.h"

#include <algorithm>
#include <cassert>
#include <cstdlib>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace torchlens {
namespace {

// Levenshtein distance: insertions, deletions and substitutions of one character.
size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

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

absl::Status FlagParser::Parse(absl::Span<const std::string> args) {
  absl::flat_hash_set<std::string>& seen = given_;
  seen.clear();
  for (size_t i = 0; i < args.size(); ++i) {
    absl::string_view arg = args[i];
    // A one-letter flag may take one dash, as Unix tools' "-h" does.
    const bool short_flag =
        arg.size() == 2 && arg[0] == '-' && arg[1] != '-' && flags_.contains(arg.substr(1));
    if (!absl::ConsumePrefix(&arg, "--") && !(short_flag && absl::ConsumePrefix(&arg, "-"))) {
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
      const std::string closest = ClosestName(name);
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag --", name,
                       closest.empty() ? "" : absl::StrCat("; did you mean --", closest, "?"),
                       " (run with --help for the flags)"));
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

std::vector<std::string> FlagParser::GivenNames() const {
  std::vector<std::string> names(given_.begin(), given_.end());
  std::sort(names.begin(), names.end());
  return names;
}

std::string FlagParser::ClosestName(absl::string_view name) const {
  // The declared flag fewest single-character edits away, when it is at most two edits or
  // a third of the name's length away (a typo, not another word); ties go to the first in
  // alphabetical order.
  std::string best;
  size_t best_distance = std::max<size_t>(2, name.size() / 3) + 1;
  std::vector<std::string> names;
  for (const auto& [declared, flag] : flags_) names.push_back(declared);
  std::sort(names.begin(), names.end());
  for (const std::string& declared : names) {
    const size_t distance = EditDistance(name, declared);
    if (distance < best_distance) {
      best_distance = distance;
      best = declared;
    }
  }
  return best;
}

std::string UserPath(const std::string& path) {
  const char* cwd = std::getenv("BUILD_WORKING_DIRECTORY");
  if (path.empty() || path[0] == '/' || cwd == nullptr) return path;
  return absl::StrCat(cwd, "/", path);
}

absl::Status FlagParser::Parse(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  return Parse(args);
}

}  // namespace torchlens
