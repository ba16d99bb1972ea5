// Command-line flags of the `torchlens` tool, parsed without exiting the process so that
// every mistake becomes one error line and exit code 2.
#ifndef TORCHLENS_TOOLS_CLI_FLAGS_H_
#define TORCHLENS_TOOLS_CLI_FLAGS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace torchlens {

// One --edit LABEL=VALUE: the node's value replaced by VALUE in every element.
struct EditFlag {
  std::string label;
  double value = 0.0;
  std::string text;  // the value as given: an integer node takes it exactly (int64 beyond 2^53)
};

struct CliOptions {
  bool help = false;
  bool version = false;
  bool describe = false;  // print the model's forward, modules, parameters, buffers; run nothing
  std::string model;      // empty: the bundled demo model
  std::vector<std::vector<int64_t>> input_shapes;
  std::string input_file;
  bool train = false;
  int64_t seed = 0;
  bool save_activations = true;
  std::string summary_file;  // empty: stdout
  std::string trace_file;    // --trace: read this saved trace instead of running a model
  bool validate = false;
  std::vector<EditFlag> edits;
  std::string render_file;                  // .svg, .png or .pdf
  std::string show_buffers = "meaningful";  // never | meaningful | always
  int render_depth = 0;                     // RenderOptions::max_module_depth
  bool rolled = false;                      // RenderOptions::rolled
  bool library_branches = false;            // also the branches inside libraries' code
  std::string json_file;
  std::string save_file;
  std::string stream_file;           // --stream_to: CaptureOptions::trace_file
  std::string compare_trace;         // a trace file to compare the new trace with
  std::string compare_model;         // a second model to run on the same inputs and compare
  bool hash = false;                 // print the structure hash
  bool non_finite = false;           // print the first op whose output holds NaN or Inf
  std::vector<std::string> modules;  // print each call of these modules and its outputs
  std::string chrome_trace;          // time every op and write a Chrome trace here
  // README "Capture in a service: save less, stop early, bound memory".
  std::vector<std::string> save_modules;
  std::vector<std::string> save_types;
  std::vector<std::string> save_labels;
  std::string halt_after;
  bool stop_at_non_finite = false;
  int64_t max_saved_bytes = -1;
  bool partial_on_budget = false;
  // After the forward, backward() from the sum of the outputs (CaptureOptions::save_grads).
  bool backward = false;
};

// "1,3,224,224" or several inputs separated by ';': "1,16;1,4". Dimensions are
// non-negative integers; a shape may hold at most 2^31 elements.
absl::StatusOr<std::vector<std::vector<int64_t>>> ParseInputShapes(absl::string_view text);

// "relu_1_2:1=5", "bn.running_mean:1=-0.5": the label (any key Trace::Find accepts) and a
// decimal value, split at the last '='.
absl::StatusOr<EditFlag> ParseEdit(absl::string_view text);

// Flags: --model, --input_shape, --input, --mode (train|eval), --seed, --no_save,
// --summary, --validate, --edit (repeatable), --render, --show_buffers, --render_depth,
// --rolled, --json, --save, --stream_to,
// --trace, --compare, --compare_model, --hash, --non_finite, --module, --chrome_trace,
// --save_modules,
// --save_types, --save_labels, --halt_after, --stop_at_non_finite, --max_saved_bytes,
// --partial_on_budget, --backward, --help; each
// as "--flag=value" or "--flag value". kInvalidArgument for an unknown flag, a flag given twice
// (except --edit), an empty value ("--model=", "--save ''"), or a value the flag does not take.
absl::StatusOr<CliOptions> ParseCommandLine(const std::vector<std::string>& args);

extern const char kUsage[];

}  // namespace torchlens

#endif  // TORCHLENS_TOOLS_CLI_FLAGS_H_
