#include "tools/cli_flags.h"

#include <limits>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "graph/label.h"
#include "tools/flag_parser.h"

namespace torchlens {

const char kUsage[] =
    "usage: torchlens [--model FILE.pt] [--input_shape 1,3,224,224[;...] | --input FILE]\n"
    "                 [--trace FILE.pt]\n"
    "                 [--mode eval|train] [--seed N] [--no_save] [--summary FILE]\n"
    "                 [--validate] [--edit LABEL=VALUE ...] [--render FILE.svg|png|pdf]\n"
    "                 [--show_buffers never|meaningful|always] [--render_depth N] [--rolled]\n"
    "                 [--library_branches]\n"
    "                 [--json FILE] [--save FILE | --stream_to FILE]\n"
    "                 [--compare TRACE | --compare_model FILE.pt] [--hash] [--non_finite]\n"
    "                 [--module M,...]\n"
    "                 [--chrome_trace FILE.json] [--save_modules M,... --save_types T,...\n"
    "                 --save_labels L,...] [--halt_after M|LABEL] [--stop_at_non_finite]\n"
    "                 [--max_saved_bytes N [--partial_on_budget]] [--backward]\n"
    "                 [-h | --help] [--version]\n"
    "       torchlens --describe [--model FILE.pt]\n"
    "\n"
    "Traces one forward pass of a TorchScript model and prints its ops, parameters and\n"
    "buffers. Without --model it traces the demo model bundled with the binary (its\n"
    "runfiles' testdata/demo.pt, never one in the current directory). Each flag may be\n"
    "given once (--edit repeats); a flag's value may not be empty.\n"
    "  --model FILE        TorchScript archive saved with torch.jit.save\n"
    "  --describe          print the model's forward (its arguments and their types),\n"
    "                      modules, parameters and buffers without running it\n"
    "  --input_shape S     random normal inputs of these shapes (';' between inputs)\n"
    "  --input FILE        inputs saved from Python with torch.save (a tensor or a\n"
    "                      list/tuple of tensors)\n"
    "  --mode eval|train   module mode during the capture (default eval)\n"
    "  --seed N            seed of the random inputs and of the forward's own random\n"
    "                      draws (dropout, noise), whatever the inputs' source (default 0)\n"
    "  --no_save           capture without saving activations\n"
    "  --summary FILE      write the summary to FILE instead of stdout\n"
    "  --trace FILE        read a trace file written by --save instead of running a\n"
    "                      model: summarize, validate, edit, compare (--compare), render\n"
    "  --validate          replay the trace and print the verdict and any failures\n"
    "                      (exit code 1 when validation fails)\n"
    "  --edit LABEL=VALUE  set that node to VALUE (every element), replay what depends\n"
    "                      on it, and print the outputs that changed (repeatable)\n"
    "  --render FILE       draw the graph (SVG, PNG or PDF by extension)\n"
    "  --show_buffers S    with --render, buffers drawn: never, meaningful (default:\n"
    "                      hides BatchNorm's running_mean, running_var and\n"
    "                      num_batches_tracked, and the add_ that counts batches in\n"
    "                      training) or always\n"
    "  --render_depth N    with --render, draw each module N levels deep as one box per\n"
    "                      call (its op count on it); 0 (default) draws every module open\n"
    "  --rolled            with --render, draw each layer's passes (and each box's calls)\n"
    "                      once; a buffer's versions once, with its reads and writes\n"
    "  --library_branches  also show the if branches inside libraries' code (PyTorch's\n"
    "                      functional.py), in the summary and the picture; by default\n"
    "                      only the model's own\n"
    "  --json FILE         write the trace's metadata as JSON\n"
    "  --save FILE         write a trace file (torch.load reads it in Python)\n"
    "  --stream_to FILE    write the trace file during the capture: each value goes to\n"
    "                      FILE when recorded and is not kept in memory\n"
    "  --compare TRACE     compare with a trace file written by --save: each node's\n"
    "                      largest differences, the first divergence marked (exit code\n"
    "                      1 when the traces diverge, as diff's)\n"
    "  --compare_model M   run model M on the same inputs and compare its trace\n"
    "  --hash              print the structure hash (the same for any inputs of these\n"
    "                      shapes; it changes when an op, edge, shape or module does)\n"
    "  --non_finite        print the first op whose output holds NaN or Inf\n"
    "  --module M,...      print each call of these modules: its ops and outputs\n"
    "  --chrome_trace F    time every op and write a Chrome trace (Perfetto) to F\n"
    "  --save_modules M,.. save values only of ops in these modules (and under them),\n"
    "  --save_types T,...  of these op types (conv2d, relu),\n"
    "  --save_labels L,... or with these labels (relu_1_5: every pass); the other ops\n"
    "                      keep their metadata\n"
    "  --halt_after X      stop the forward after module X's call or after op X\n"
    "                      (relu_1_5:1, or relu_1_5 for its first pass);\n"
    "                      the buffers are put back as they were before it\n"
    "  --stop_at_non_finite  halt after the first op whose output holds NaN or Inf\n"
    "  --max_saved_bytes N stop saving at N bytes of saved values: an error, or with\n"
    "  --partial_on_budget the trace so far marked partial\n"
    "  --backward          after the forward, run backward() from the sum of its\n"
    "                      outputs: every value's gradient (a grad norm column), the\n"
    "                      backward ops, per-module gradient norms; --validate,\n"
    "                      --non_finite, --compare, --render, --json and the trace\n"
    "                      files take the gradients too\n"
    "  -h, --help          print this and exit\n"
    "  --version           print the trace-file and JSON versions and LibTorch's\n"
    "\n"
    "Exit codes: 0 done; 1 done, and --validate failed or --compare diverged (values or\n"
    "gradients); 2 an error\n"
    "(one line on stderr). A flag only the trace can check (an --edit or --module name, a\n"
    "--compare file) is reported after everything else asked was done.\n";

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
      const bool digits = !dim.empty() && dim.find_first_not_of("0123456789") == dim.npos;
      if (digits && dim.size() > 12) {
        return absl::InvalidArgumentError(
            absl::StrCat("--input_shape \"", text, "\": dimension \"", dim,
                         "\" is too large (at most 12 digits); expected e.g. 1,3,224,224"));
      }
      if (!digits || !absl::SimpleAtoi(dim, &value) || value < 0) {
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
  edit.text = std::string(value);
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
  bool no_save = false;
  FlagParser flags;
  flags.Switch("help", &options.help);
  flags.Switch("h", &options.help);
  flags.Switch("version", &options.version);
  flags.Switch("describe", &options.describe);
  flags.Switch("no_save", &no_save);
  flags.Switch("validate", &options.validate);
  flags.Switch("hash", &options.hash);
  flags.Switch("non_finite", &options.non_finite);
  flags.List("module", &options.modules);
  flags.String("model", &options.model);
  flags.String("input", &options.input_file);
  flags.String("summary", &options.summary_file);
  flags.String("json", &options.json_file);
  flags.String("save", &options.save_file);
  flags.String("stream_to", &options.stream_file);
  flags.String("compare", &options.compare_trace);
  flags.String("compare_model", &options.compare_model);
  flags.String("chrome_trace", &options.chrome_trace);
  flags.List("save_modules", &options.save_modules);
  flags.List("save_types", &options.save_types);
  flags.List("save_labels", &options.save_labels);
  flags.String("halt_after", &options.halt_after);
  flags.Switch("stop_at_non_finite", &options.stop_at_non_finite);
  flags.Int("max_saved_bytes", &options.max_saved_bytes, 0);
  flags.Switch("partial_on_budget", &options.partial_on_budget);
  flags.Switch("backward", &options.backward);
  flags.Value("render", [&](absl::string_view v) {
    if (!absl::EndsWithIgnoreCase(v, ".svg") && !absl::EndsWithIgnoreCase(v, ".png") &&
        !absl::EndsWithIgnoreCase(v, ".pdf")) {
      return absl::InvalidArgumentError(
          absl::StrCat("--render \"", v, "\": the file name must end in .svg, .png or .pdf"));
    }
    options.render_file = std::string(v);
    return absl::OkStatus();
  });
  flags.Int("render_depth", &options.render_depth, 0);
  flags.Switch("rolled", &options.rolled);
  flags.Switch("library_branches", &options.library_branches);
  flags.Value("show_buffers", [&](absl::string_view v) {
    if (v != "never" && v != "meaningful" && v != "always") {
      return absl::InvalidArgumentError(
          absl::StrCat("--show_buffers \"", v, "\": expected never, meaningful or always"));
    }
    options.show_buffers = std::string(v);
    return absl::OkStatus();
  });
  flags.Value(
      "edit",
      [&](absl::string_view v) {
        absl::StatusOr<EditFlag> edit = ParseEdit(v);
        if (!edit.ok()) return edit.status();
        options.edits.push_back(*std::move(edit));
        return absl::OkStatus();
      },
      /*repeatable=*/true);
  flags.Value("input_shape", [&](absl::string_view v) {
    absl::StatusOr<std::vector<std::vector<int64_t>>> shapes = ParseInputShapes(v);
    if (!shapes.ok()) return shapes.status();
    options.input_shapes = *std::move(shapes);
    return absl::OkStatus();
  });
  flags.String("trace", &options.trace_file);
  std::vector<std::string> capture_flags_given;  // --mode and --seed have defaults
  flags.Value("mode", [&](absl::string_view v) {
    capture_flags_given.push_back("--mode");
    if (v != "train" && v != "eval") {
      return absl::InvalidArgumentError(absl::StrCat("--mode \"", v, "\": expected train or eval"));
    }
    options.train = v == "train";
    return absl::OkStatus();
  });
  flags.Value("seed", [&](absl::string_view v) {
    capture_flags_given.push_back("--seed");
    if (!absl::SimpleAtoi(v, &options.seed)) {
      return absl::InvalidArgumentError(absl::StrCat("--seed \"", v, "\" is not an integer"));
    }
    return absl::OkStatus();
  });
  if (absl::Status parsed = flags.Parse(args); !parsed.ok()) return parsed;
  options.save_activations = !no_save;
  if (options.describe) {
    // It runs nothing: a flag about running, answering or writing a trace would be ignored.
    std::vector<std::string> given;
    for (const std::string& flag : flags.GivenNames()) {
      if (flag != "describe" && flag != "model" && flag != "summary") {
        given.push_back(absl::StrCat("--", flag));
      }
    }
    if (!given.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--describe prints the model without running it and takes --model and --summary "
          "only, not ",
          absl::StrJoin(given, ", ")));
    }
  }
  // Flags that only say how to draw: ignored without a picture, so refused.
  std::vector<std::string> render_flags_given;
  for (const char* flag : {"show_buffers", "render_depth", "rolled"}) {
    if (flags.Given(flag)) render_flags_given.push_back(absl::StrCat("--", flag));
  }
  if (!render_flags_given.empty() && options.render_file.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        absl::StrJoin(render_flags_given, ", "), render_flags_given.size() == 1 ? " says" : " say",
        " how to draw the graph, but no --render FILE.svg|png|pdf asks for a picture"));
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
  if (options.backward && (!options.halt_after.empty() || options.stop_at_non_finite)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--backward runs backward() from the forward's outputs, which a halted forward (",
        options.stop_at_non_finite ? "--stop_at_non_finite" : "--halt_after",
        ") does not return; drop one of them"));
  }
  if (options.partial_on_budget && options.max_saved_bytes < 0) {
    return absl::InvalidArgumentError("--partial_on_budget needs --max_saved_bytes");
  }
  if (!options.stream_file.empty()) {
    // CaptureOptions::trace_file keeps every value, on disk.
    std::vector<std::string> given;
    auto refuse_if = [&](bool set, const char* flag) {
      if (set) given.push_back(flag);
    };
    refuse_if(!options.save_file.empty(), "--save");
    refuse_if(no_save, "--no_save");
    refuse_if(!options.save_modules.empty(), "--save_modules");
    refuse_if(!options.save_types.empty(), "--save_types");
    refuse_if(!options.save_labels.empty(), "--save_labels");
    refuse_if(options.max_saved_bytes >= 0, "--max_saved_bytes");
    if (!given.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--stream_to writes every value to its file as it is captured; it cannot be "
          "combined with ",
          absl::StrJoin(given, ", "), " (use --save for a trace saved after the capture)"));
    }
  }
  if (!options.trace_file.empty()) {
    // A saved trace is looked at as it was captured: flags that describe a capture would
    // be silently ignored.
    std::vector<std::string> given = capture_flags_given;
    auto refuse_if = [&](bool set, const char* flag) {
      if (set) given.push_back(flag);
    };
    refuse_if(!options.model.empty(), "--model");
    refuse_if(!options.input_shapes.empty(), "--input_shape");
    refuse_if(!options.input_file.empty(), "--input");
    refuse_if(no_save, "--no_save");
    refuse_if(!options.stream_file.empty(), "--stream_to");
    refuse_if(!options.compare_model.empty(), "--compare_model");
    refuse_if(!options.chrome_trace.empty(), "--chrome_trace");
    refuse_if(!options.save_modules.empty(), "--save_modules");
    refuse_if(!options.save_types.empty(), "--save_types");
    refuse_if(!options.save_labels.empty(), "--save_labels");
    refuse_if(!options.halt_after.empty(), "--halt_after");
    refuse_if(options.stop_at_non_finite, "--stop_at_non_finite");
    refuse_if(options.max_saved_bytes >= 0, "--max_saved_bytes");
    refuse_if(options.backward, "--backward");
    if (!given.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--trace reads a saved trace, but ", absl::StrJoin(given, ", "),
                       given.size() == 1 ? " describes" : " describe",
                       " a capture; drop --trace to capture a model, or drop the capture flags"));
    }
  }
  if (!options.input_shapes.empty() && !options.input_file.empty()) {
    return absl::InvalidArgumentError("give --input_shape or --input, not both");
  }
  return options;
}

}  // namespace torchlens
