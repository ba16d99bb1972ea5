#include "tools/cli_flags.h"

#include <limits>
#include <optional>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "graph/label.h"

namespace torchlens {

const char kUsage[] =
    "usage: torchlens [--model FILE.pt] [--input_shape 1,3,224,224[;...] | --input FILE]\n"
    "                 [--mode eval|train] [--seed N] [--no_save] [--summary FILE]\n"
    "                 [--validate] [--edit LABEL=VALUE ...] [--render FILE.svg|png|pdf]\n"
    "                 [--show_buffers never|meaningful|always] [--json FILE] [--save FILE]\n"
    "                 [--compare TRACE | --compare_model FILE.pt] [--hash] [--non_finite]\n"
    "                 [--chrome_trace FILE.json]\n"
    "\n"
    "Traces one forward pass of a TorchScript model and prints its ops, parameters and\n"
    "buffers. Without --model it traces the demo model bundled with the binary (its\n"
    "runfiles' testdata/demo.pt, never one in the current directory). Each flag may be\n"
    "given once (--edit repeats); a flag's value may not be empty.\n"
    "  --model FILE        TorchScript archive saved with torch.jit.save\n"
    "  --input_shape S     random normal inputs of these shapes (';' between inputs)\n"
    "  --input FILE        inputs saved from Python with torch.save (a tensor or a\n"
    "                      list/tuple of tensors)\n"
    "  --mode eval|train   module mode during the capture (default eval)\n"
    "  --seed N            seed of the random inputs (default 0)\n"
    "  --no_save           capture without saving activations\n"
    "  --summary FILE      write the summary to FILE instead of stdout\n"
    "  --validate          replay the trace and print the verdict and any failures\n"
    "                      (exit code 1 when validation fails)\n"
    "  --edit LABEL=VALUE  set that node to VALUE (every element), replay what depends\n"
    "                      on it, and print the outputs that changed (repeatable)\n"
    "  --render FILE       draw the graph (SVG, PNG or PDF by extension)\n"
    "  --show_buffers S    buffers drawn: never, meaningful (default: hides BatchNorm\n"
    "                      running statistics and counters) or always\n"
    "  --json FILE         write the trace's metadata as JSON\n"
    "  --save FILE         write a trace file (torch.load reads it in Python)\n"
    "  --compare TRACE     compare with a trace file written by --save: each node's\n"
    "                      largest differences, the first divergence marked\n"
    "  --compare_model M   run model M on the same inputs and compare its trace\n"
    "  --hash              print the structure hash (the same for any inputs of these\n"
    "                      shapes; it changes when an op, edge, shape or module does)\n"
    "  --non_finite        print the first op whose output holds NaN or Inf\n"
    "  --chrome_trace F    time every op and write a Chrome trace (Perfetto) to F\n";

absl::StatusOr<std::vector<std::vector<int64_t>>> ParseInputShapes(absl::string_view text) {
  if (text.empty()) {
    return absl::InvalidArgumentError(
        "--input_shape is empty; expected comma-separated dimensions such as 1,3,224,224 "
        "(';' between inputs)");
  }
  std::vector<std::vector<int64_t>> shapes;
  for (absl::string_view input : absl::StrSplit(text, ';')) {
    std::vector<int64_t> shape;
    int64_t elements = 1;
    for (absl::string_view dim : absl::StrSplit(input, ',')) {
      dim = absl::StripAsciiWhitespace(dim);
      int64_t value = 0;
      if (dim.empty() || dim.size() > 12 || !absl::SimpleAtoi(dim, &value) || value < 0 ||
          dim.find_first_not_of("0123456789") != absl::string_view::npos) {
        return absl::InvalidArgumentError(
            absl::StrCat("--input_shape \"", text, "\": dimension \"", dim,
                         "\" is not a non-negative integer; expected e.g. 1,3,224,224"));
      }
      shape.push_back(value);
      elements = value == 0 ? 0 : elements;
      if (value > 0 && elements > (int64_t{1} << 31) / value) {
        return absl::InvalidArgumentError(
            absl::StrCat("--input_shape \"", text, "\": an input of more than 2^31 elements"));
      }
      elements *= value;
    }
    shapes.push_back(std::move(shape));
  }
  return shapes;
}

absl::StatusOr<EditFlag> ParseEdit(absl::string_view text) {
  const size_t eq = text.rfind('=');
  if (eq == absl::string_view::npos || eq == 0 || eq + 1 == text.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--edit \"", text, "\": expected LABEL=VALUE, e.g. relu_1_2:1=5"));
  }
  EditFlag edit;
  edit.label = std::string(text.substr(0, eq));
  absl::string_view value = absl::StripAsciiWhitespace(text.substr(eq + 1));
  if (!absl::SimpleAtod(value, &edit.value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--edit \"", text, "\": \"", value, "\" is not a number"));
  }
  if (absl::StatusOr<ParsedKey> key = ParseKey(edit.label); !key.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--edit \"", text, "\": ", key.status().message()));
  }
  return edit;
}

absl::StatusOr<CliOptions> ParseCommandLine(const std::vector<std::string>& args) {
  CliOptions options;
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
    // A second --model (or any flag but --edit) would silently replace the first.
    if (name != "edit" && !seen.insert(name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, " is given twice; give it once (only --edit repeats)"));
    }
    auto take_value = [&]() -> absl::StatusOr<std::string> {
      if (!value.has_value()) {
        if (i + 1 >= args.size()) {
          return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
        }
        value = args[++i];
      }
      // `--model=` or `--save ''` (an unset shell variable) must not mean "the default".
      if (value->empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", name, " is empty; give a value or leave the flag out"));
      }
      return *value;
    };
    auto no_value = [&]() -> absl::Status {
      if (value.has_value()) {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " takes no value"));
      }
      return absl::OkStatus();
    };
    if (name == "help" || name == "h") {
      if (absl::Status s = no_value(); !s.ok()) return s;
      options.help = true;
    } else if (name == "no_save") {
      if (absl::Status s = no_value(); !s.ok()) return s;
      options.save_activations = false;
    } else if (name == "validate") {
      if (absl::Status s = no_value(); !s.ok()) return s;
      options.validate = true;
    } else if (name == "hash") {
      if (absl::Status s = no_value(); !s.ok()) return s;
      options.hash = true;
    } else if (name == "non_finite") {
      if (absl::Status s = no_value(); !s.ok()) return s;
      options.non_finite = true;
    } else if (name == "model" || name == "input" || name == "summary" || name == "input_shape" ||
               name == "mode" || name == "seed" || name == "edit" || name == "render" ||
               name == "show_buffers" || name == "json" || name == "save" || name == "compare" ||
               name == "compare_model" || name == "chrome_trace") {
      absl::StatusOr<std::string> v = take_value();
      if (!v.ok()) return v.status();
      if (name == "model") {
        options.model = *v;
      } else if (name == "input") {
        options.input_file = *v;
      } else if (name == "summary") {
        options.summary_file = *v;
      } else if (name == "render") {
        if (!absl::EndsWithIgnoreCase(*v, ".svg") && !absl::EndsWithIgnoreCase(*v, ".png") &&
            !absl::EndsWithIgnoreCase(*v, ".pdf")) {
          return absl::InvalidArgumentError(
              absl::StrCat("--render \"", *v, "\": the file name must end in .svg, .png or .pdf"));
        }
        options.render_file = *v;
      } else if (name == "json") {
        options.json_file = *v;
      } else if (name == "save") {
        options.save_file = *v;
      } else if (name == "compare") {
        options.compare_trace = *v;
      } else if (name == "compare_model") {
        options.compare_model = *v;
      } else if (name == "chrome_trace") {
        options.chrome_trace = *v;
      } else if (name == "show_buffers") {
        if (*v != "never" && *v != "meaningful" && *v != "always") {
          return absl::InvalidArgumentError(
              absl::StrCat("--show_buffers \"", *v, "\": expected never, meaningful or always"));
        }
        options.show_buffers = *v;
      } else if (name == "edit") {
        absl::StatusOr<EditFlag> edit = ParseEdit(*v);
        if (!edit.ok()) return edit.status();
        options.edits.push_back(*std::move(edit));
      } else if (name == "input_shape") {
        absl::StatusOr<std::vector<std::vector<int64_t>>> shapes = ParseInputShapes(*v);
        if (!shapes.ok()) return shapes.status();
        options.input_shapes = *std::move(shapes);
      } else if (name == "mode") {
        if (*v != "train" && *v != "eval") {
          return absl::InvalidArgumentError(
              absl::StrCat("--mode \"", *v, "\": expected train or eval"));
        }
        options.train = *v == "train";
      } else if (!absl::SimpleAtoi(*v, &options.seed)) {
        return absl::InvalidArgumentError(absl::StrCat("--seed \"", *v, "\" is not an integer"));
      }
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag --", name, "; run with --help for the flags"));
    }
  }
  if ((options.validate || !options.edits.empty()) && !options.save_activations) {
    return absl::InvalidArgumentError(absl::StrCat(options.validate ? "--validate" : "--edit",
                                                   " needs saved values; drop --no_save"));
  }
  if (!options.compare_trace.empty() && !options.compare_model.empty()) {
    return absl::InvalidArgumentError("give --compare or --compare_model, not both");
  }
  if ((!options.compare_trace.empty() || !options.compare_model.empty() || options.non_finite) &&
      !options.save_activations) {
    return absl::InvalidArgumentError(absl::StrCat(
        options.non_finite ? "--non_finite" : "--compare", " needs saved values; drop --no_save"));
  }
  if (!options.input_shapes.empty() && !options.input_file.empty()) {
    return absl::InvalidArgumentError("give --input_shape or --input, not both");
  }
  return options;
}

}  // namespace torchlens
