// The `torchlens` command-line tool: traces one forward pass and prints a summary.
//
//   tools/bazelw run //tools:torchlens
//   tools/bazelw run //tools:torchlens -- --model /path/model.pt --input_shape 1,3,224,224
//
// Every failure prints one line "torchlens: error: ..." and exits with code 2.
#include <ATen/CPUGeneratorImpl.h>
#include <sys/stat.h>
#include <torch/script.h>
#include <torch/serialize.h>
#include <torch/version.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "graph/compare.h"
#include "graph/file_io.h"
#include "graph/json_export.h"
#include "graph/module_calls.h"
#include "graph/non_finite.h"
#include "graph/op_timing.h"
#include "graph/render.h"
#include "graph/structure_hash.h"
#include "graph/summary.h"
#include "graph/torch_load.h"
#include "graph/trace_file.h"
#include "graph/trace_file_writer.h"
#include "tools/cli_edits.h"
#include "tools/cli_flags.h"
#include "tools/flag_parser.h"
#include "torchlens_dispatch/capture.h"
#include "torchlens_dispatch/large_stack.h"
#include "torchlens_dispatch/load_model.h"
#include "torchlens_dispatch/ops/exception_text.h"
#include "torchlens_dispatch/ops/ivalue_tensors.h"
#include "validation/validate.h"

namespace torchlens {
namespace {

const std::vector<int64_t> kBundledInputShape = {1, 3, 16, 16};

// The demo model in this binary's runfiles (bazel run, bazel test, or bazel-bin/tools/
// torchlens run directly). Never a testdata/demo.pt of the current directory, which would
// trace whatever file happens to be there.
absl::StatusOr<std::string> BundledModelPath() {
  constexpr char kInRunfiles[] = "/torchlens/testdata/demo.pt";
  std::vector<std::string> candidates;
  char exe[4096];
  if (const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1); n > 0) {
    candidates.push_back(absl::StrCat(absl::string_view(exe, n), ".runfiles", kInRunfiles));
  }
  if (const char* runfiles = std::getenv("RUNFILES_DIR"); runfiles != nullptr) {
    candidates.push_back(absl::StrCat(runfiles, kInRunfiles));
  }
  for (const std::string& candidate : candidates) {
    struct stat info;
    if (::stat(candidate.c_str(), &info) == 0 && S_ISREG(info.st_mode)) return candidate;
  }
  return absl::NotFoundError(
      absl::StrCat("the bundled demo model is not in this binary's runfiles (looked for ",
                   absl::StrJoin(candidates, ", "), "); give a model with --model FILE"));
}

// The first non-finite value, or that there is none.
absl::StatusOr<std::string> DescribeNonFinite(const Trace& trace) {
  absl::StatusOr<std::optional<NonFinite>> first = FirstNonFinite(trace);
  if (!first.ok()) return first.status();
  if (!first->has_value()) return std::string("\nNon-finite values: none\n");
  const NonFinite& found = **first;
  std::vector<std::string> parents;
  for (const auto& [label, finite] : found.parents) {
    parents.push_back(absl::StrCat(label, finite ? " (finite)" : " (not finite)"));
  }
  return absl::StrCat("\nFirst non-finite value: ", found.label, " in '", found.module_address,
                      "' (", found.has_nan ? "NaN" : "", found.has_nan && found.has_inf ? ", " : "",
                      found.has_inf ? "Inf" : "",
                      "); parents: ", parents.empty() ? "none" : absl::StrJoin(parents, ", "),
                      "\n");
}

// --non_finite with gradients: where the first NaN or Inf gradient came from.
absl::StatusOr<std::string> DescribeNonFiniteGradient(const Trace& trace) {
  absl::StatusOr<std::optional<NonFiniteGradient>> first = FirstNonFiniteGradient(trace);
  if (!first.ok()) return first.status();
  if (!first->has_value()) return std::string("Non-finite gradients: none\n");
  const NonFiniteGradient& found = **first;
  std::vector<std::string> readers;
  for (const auto& [label, finite] : found.readers) {
    readers.push_back(absl::StrCat(label, finite ? " (finite gradient)" : " (not finite)"));
  }
  return absl::StrCat(
      "First non-finite gradient, in backward order: ", found.is_param ? "parameter " : "",
      found.label, " in '", found.module_address, "' (", found.has_nan ? "NaN" : "",
      found.has_nan && found.has_inf ? ", " : "", found.has_inf ? "Inf" : "", ")",
      found.backward_op.empty() ? "" : absl::StrCat(", at ", found.backward_op),
      "; from its readers: ", readers.empty() ? "none" : absl::StrJoin(readers, ", "), "\n");
}

// --backward: backward() from the sum of the forward's outputs that require grad.
absl::Status Backward(const c10::IValue& outputs) {
  at::Tensor loss;
  ForEachTensor(outputs, [&](const at::Tensor& t) {
    if (!t.defined() || !t.requires_grad() || !(t.is_floating_point() || t.is_complex())) return;
    const at::Tensor sum = t.sum();
    loss = loss.defined() ? loss + sum : sum;
  });
  if (!loss.defined()) {
    return absl::InvalidArgumentError(
        "--backward: no output of the forward requires grad (the model has no parameters that "
        "require grad, or returns values computed without them); drop --backward");
  }
  try {
    loss.backward();
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("--backward: backward() of the sum of the outputs failed: ", FirstLine(e)));
  }
  return absl::OkStatus();
}

// Copies of the forward's arguments that share no tensor with them, for a second model
// that must see the inputs as the first one got them (a forward may write its inputs).
std::vector<c10::IValue> CloneInputs(const std::vector<c10::IValue>& inputs) {
  std::vector<c10::IValue> copies;
  for (const c10::IValue& input : inputs) {
    copies.push_back(MapTensors(input, [](const at::Tensor& t) { return t.clone(); }));
  }
  return copies;
}

// Exit code 1: the tool worked, and the trace did not validate or --compare found a
// divergence (as `diff` says its inputs differ).
constexpr int kAnswerIsNo = 1;

// The summary, to standard output. A reader that closed the pipe early (`torchlens | head
// -1`) is no error, as for any Unix tool: writing stops quietly. A full disk is an error
// (SIGPIPE is ignored in main so that a closed pipe is an EPIPE to tell from it).
absl::Status WriteStdout(absl::string_view text) {
  if (std::fwrite(text.data(), 1, text.size(), stdout) != text.size() || std::fflush(stdout) != 0) {
    if (errno == EPIPE) return absl::OkStatus();
    return absl::ErrnoToStatus(errno, "cannot write the summary to standard output");
  }
  return absl::OkStatus();
}

// A message of the capture or of a loader, in the tool's words: the flags, not the C++
// options they set.
std::string InFlagTerms(absl::string_view message) {
  std::string text(message);
  for (const auto& [api, flag] : std::vector<std::pair<std::string, std::string>>{
           {"CaptureOptions::halt_after", "--halt_after"},
           {"CaptureOptions::max_saved_bytes", "--max_saved_bytes"},
           {"CaptureOptions::partial_on_budget", "--partial_on_budget"},
           {"CaptureOptions::stop_at_non_finite", "--stop_at_non_finite"},
           {"CaptureOptions::save_modules", "--save_modules"},
           {"CaptureOptions::save_types", "--save_types"},
           {"CaptureOptions::save_labels", "--save_labels"},
           {"CaptureOptions::trace_file", "--stream_to"},
           {"CaptureOptions::save_activations", "--no_save"},
           {"(save_modules, save_types, save_labels, save_if)",
            "(--save_modules, --save_types, --save_labels)"},
           {"set partial_on_budget", "give --partial_on_budget"},
       }) {
    for (size_t at = text.find(api); at != std::string::npos;
         at = text.find(api, at + flag.size())) {
      text.replace(at, api.size(), flag);
    }
  }
  return text;
}

// What the tool looks at: a trace it captured, or one read from --trace, and the reference
// of --compare_model (the second model run on the same inputs).
struct Subject {
  Trace trace;
  std::string name;  // the model's path, or the trace file's
  std::optional<Trace> second_model;
};

// "forward(x: Tensor, h: Optional[Tensor] = ...) -> Tuple[Tensor, Tensor]": the
// arguments after self, with their TorchScript types, and what it returns.
std::string ForwardSignature(const torch::jit::Module& model) {
  const c10::optional<torch::jit::Method> forward = model.find_method("forward");
  if (!forward.has_value()) return "missing (the model has no forward method)";
  const c10::FunctionSchema& schema = forward->function().getSchema();
  std::vector<std::string> arguments;
  for (size_t i = 1; i < schema.arguments().size(); ++i) {
    const c10::Argument& argument = schema.arguments()[i];
    arguments.push_back(absl::StrCat(argument.name(), ": ", argument.type()->annotation_str(),
                                     argument.default_value().has_value() ? " = ..." : ""));
  }
  std::vector<std::string> returns;
  for (const c10::Argument& value : schema.returns()) {
    returns.push_back(value.type()->annotation_str());
  }
  return absl::StrCat(
      "forward(", absl::StrJoin(arguments, ", "), ") -> ",
      returns.size() == 1 ? returns[0] : absl::StrCat("(", absl::StrJoin(returns, ", "), ")"));
}

// --describe: the model as loaded, without running it: its forward's signature, modules,
// parameters and buffers.
std::string DescribeModel(const torch::jit::Module& model, const std::string& path) {
  const auto type_name = [](const torch::jit::Module& module) {
    const c10::optional<c10::QualifiedName>& name = module.type()->name();
    return name.has_value() ? name->name() : std::string("-");
  };
  std::string out =
      absl::StrCat("torchlens model ", path, "\n\nForward: ", ForwardSignature(model),
                   "\nSaved in ", model.is_training() ? "training" : "eval",
                   " mode; captures run in eval mode unless --mode train says otherwise\n");
  std::vector<std::vector<std::string>> modules = {{"address", "type"}};
  for (const torch::jit::NameModule& module : model.named_modules()) {
    modules.push_back({module.name.empty() ? "-" : module.name, type_name(module.value)});
  }
  std::vector<std::vector<std::string>> params = {{"address", "shape", "dtype"}};
  int64_t values = 0;
  for (const torch::jit::NameTensor& param : model.named_parameters()) {
    params.push_back({param.name, absl::StrCat("[", absl::StrJoin(param.value.sizes(), ", "), "]"),
                      c10::toString(param.value.scalar_type())});
    values += param.value.numel();
  }
  std::vector<std::vector<std::string>> buffers = {{"address", "shape", "dtype"}};
  for (const torch::jit::NameTensor& buffer : model.named_buffers()) {
    buffers.push_back({buffer.name,
                       absl::StrCat("[", absl::StrJoin(buffer.value.sizes(), ", "), "]"),
                       c10::toString(buffer.value.scalar_type())});
  }
  const auto table = [&out](const std::vector<std::vector<std::string>>& rows) {
    std::vector<size_t> widths(rows[0].size(), 0);
    for (const auto& row : rows) {
      for (size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
    }
    for (const auto& row : rows) {
      std::string line = " ";
      for (size_t c = 0; c < row.size(); ++c) {
        absl::StrAppend(&line, " ", row[c],
                        c + 1 < row.size() ? std::string(widths[c] - row[c].size() + 1, ' ') : "");
      }
      absl::StrAppend(&out, line, "\n");
    }
  };
  absl::StrAppend(&out, "\nModules: ", modules.size() - 1, "\n");
  table(modules);
  absl::StrAppend(&out, "\nParameters: ", params.size() - 1, " (", Count(values, "value", "values"),
                  ")\n");
  if (params.size() > 1) table(params);
  absl::StrAppend(&out, "\nBuffers: ", buffers.size() - 1, "\n");
  if (buffers.size() > 1) table(buffers);
  return out;
}

// --halt_after's key for the capture: a module address, or an op label. A label without
// its pass ("relu_1_5", as --edit and Trace::Find take it) means its first pass.
std::string HaltKey(const torch::jit::Module& model, const std::string& key) {
  if (key.empty() || key.find(':') != std::string::npos) return key;
  for (const torch::jit::NameModule& module : model.named_modules()) {
    if (module.name == key) return key;
  }
  // type_index_step: the last two '_'-separated parts are numbers.
  const std::vector<absl::string_view> parts = absl::StrSplit(key, '_');
  const auto number = [](absl::string_view part) {
    return !part.empty() && part.find_first_not_of("0123456789") == absl::string_view::npos;
  };
  if (parts.size() >= 3 && number(parts[parts.size() - 1]) && number(parts[parts.size() - 2])) {
    return absl::StrCat(key, ":1");
  }
  return key;
}

absl::StatusOr<Subject> CaptureFromFlags(const CliOptions& options) {
  const bool bundled = options.model.empty();
  absl::StatusOr<std::string> model_path = bundled ? BundledModelPath() : UserPath(options.model);
  if (!model_path.ok()) return model_path.status();
  absl::StatusOr<torch::jit::Module> model = LoadTorchScript(*model_path);
  if (!model.ok()) return model.status();
  model->train(options.train);

  // --seed seeds the generator the forward draws from (dropout in training, noise, sampled
  // actions), whatever the inputs' source; random inputs are drawn from it first.
  torch::manual_seed(static_cast<uint64_t>(options.seed));
  std::vector<c10::IValue> inputs;
  if (!options.input_file.empty()) {
    absl::StatusOr<std::vector<c10::IValue>> loaded = LoadInputs(UserPath(options.input_file));
    if (!loaded.ok()) return loaded.status();
    inputs = *std::move(loaded);
  } else {
    std::vector<std::vector<int64_t>> shapes = options.input_shapes;
    if (shapes.empty()) {
      if (!bundled) {
        return absl::InvalidArgumentError(
            absl::StrCat("give the model's inputs with --input_shape (e.g. 1,3,224,224) or "
                         "--input FILE; its forward is ",
                         ForwardSignature(*model)));
      }
      shapes.push_back(kBundledInputShape);
    }
    for (const std::vector<int64_t>& shape : shapes) inputs.push_back(torch::randn(shape));
  }

  CaptureOptions capture;
  capture.save_activations = options.save_activations;
  capture.time_ops = !options.chrome_trace.empty();
  capture.save_modules = options.save_modules;
  capture.save_types = options.save_types;
  // A label without its pass ("relu_1_5") selects every pass of its layer.
  std::vector<std::string> layers;  // "relu_1_5:"
  for (const std::string& label : options.save_labels) {
    if (label.find(':') == std::string::npos) {
      layers.push_back(absl::StrCat(label, ":"));
    } else {
      capture.save_labels.push_back(label);
    }
  }
  if (!layers.empty()) {
    capture.save_if = [layers](const OpQuery& op) {
      return std::any_of(layers.begin(), layers.end(), [&](const std::string& layer) {
        return op.label.substr(0, layer.size()) == layer;
      });
    };
  }
  capture.halt_after = HaltKey(*model, options.halt_after);
  capture.stop_at_non_finite = options.stop_at_non_finite;
  capture.max_saved_bytes = options.max_saved_bytes;
  capture.partial_on_budget = options.partial_on_budget;
  capture.save_grads = options.backward;
  if (!options.stream_file.empty()) capture.trace_file = UserPath(options.stream_file);
  std::vector<c10::IValue> second_inputs;
  if (!options.compare_model.empty()) second_inputs = CloneInputs(inputs);
  // --compare_model's forward draws the same random numbers as the first one.
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  const at::Tensor forward_rng_state = generator.get_state();
  c10::IValue outputs;
  absl::StatusOr<Trace> trace = TraceModule(*model, std::move(inputs), capture, &outputs);
  if (!trace.ok()) return trace.status();
  if (options.backward) {
    if (absl::Status backward = Backward(outputs); !backward.ok()) return backward;
    // The file the capture wrote has no gradients yet: written again, value by value.
    if (!capture.trace_file.empty()) {
      if (absl::Status written = WriteTraceFile(*trace, capture.trace_file); !written.ok()) {
        return written;
      }
    }
  }
  capture.trace_file.clear();  // --compare_model's trace stays in memory
  Subject subject{*std::move(trace), *model_path};
  if (!options.compare_model.empty()) {
    absl::StatusOr<torch::jit::Module> second = LoadTorchScript(UserPath(options.compare_model));
    if (!second.ok()) return second.status();
    second->train(options.train);
    generator.set_state(forward_rng_state);
    c10::IValue second_outputs;
    absl::StatusOr<Trace> traced =
        TraceModule(*second, std::move(second_inputs), capture, &second_outputs);
    if (traced.ok() && options.backward) {
      if (absl::Status backward = Backward(second_outputs); !backward.ok()) traced = backward;
    }
    if (!traced.ok()) {
      return absl::Status(
          traced.status().code(),
          absl::StrCat("--compare_model ", options.compare_model, ": ", traced.status().message()));
    }
    subject.second_model = *std::move(traced);
  }
  return subject;
}

absl::Status Run(const std::vector<std::string>& args, int* exit_code) {
  absl::StatusOr<CliOptions> options = ParseCommandLine(args);
  if (!options.ok()) return options.status();
  if (options->help) return WriteStdout(kUsage);
  if (options->version) {
    return WriteStdout(absl::StrCat("torchlens: trace files version ", kTraceFileVersion,
                                    ", JSON schema version ", kJsonSchemaVersion, ", LibTorch ",
                                    TORCH_VERSION, "\n"));
  }
  if (options->describe) {
    const std::string path = options->model.empty() ? std::string() : UserPath(options->model);
    absl::StatusOr<std::string> model_path = path.empty() ? BundledModelPath() : path;
    if (!model_path.ok()) return model_path.status();
    absl::StatusOr<torch::jit::Module> model = LoadTorchScript(*model_path);
    if (!model.ok()) return model.status();
    const std::string described = DescribeModel(*model, *model_path);
    return options->summary_file.empty()
               ? WriteStdout(described)
               : WriteFileBytes(UserPath(options->summary_file), described, "--summary file");
  }
  absl::StatusOr<Subject> subject;
  if (!options->trace_file.empty()) {
    absl::StatusOr<Trace> loaded = LoadTrace(UserPath(options->trace_file));
    if (!loaded.ok()) return loaded.status();
    subject = Subject{*std::move(loaded), options->trace_file};
  } else {
    subject = CaptureFromFlags(*options);
  }
  if (!subject.ok()) return subject.status();
  const Trace* trace = &subject->trace;
  // The reference of --compare: a trace file, or the second model on the same inputs.
  std::optional<Trace> reference = std::move(subject->second_model);
  std::string reference_name = options->compare_model;
  absl::Status reference_error;
  if (!options->compare_trace.empty()) {
    absl::StatusOr<Trace> loaded = LoadTrace(UserPath(options->compare_trace));
    if (loaded.ok()) reference = *std::move(loaded);
    if (!loaded.ok()) {
      reference_error = absl::Status(loaded.status().code(),
                                     absl::StrCat("--compare: ", loaded.status().message()));
    }
    reference_name = options->compare_trace;
  }

  std::string summary = absl::StrCat(
      options->trace_file.empty() ? "torchlens trace of " : "torchlens trace file ", subject->name,
      "\n\n", InFlagTerms(FormatSummary(*trace, options->library_branches)));
  // Flags whose values only the trace can check (--edit and --module names, --compare's
  // file): a mistake in one costs nothing else that was asked. Everything else is done and
  // written, then the mistakes are the one error line.
  std::vector<std::string> problems;
  JsonMembers json_extra;
  absl::StatusOr<ValidationReport> report =
      options->validate ? ValidateForwardPass(*trace) : absl::StatusOr<ValidationReport>();
  if (options->validate && !report.ok()) problems.emplace_back(report.status().message());
  if (options->validate && report.ok()) {
    json_extra.emplace_back("validation", ValidationReportToJson(*report));
    absl::StrAppend(&summary, "\nValidation: ", report->passed ? "PASSED" : "FAILED", " (",
                    Count(report->ops_checked, "node", "nodes"), " checked, ",
                    Count(report->perturbations_checked, "perturbation", "perturbations"), ", ",
                    Count(report->failures.size(), "failure", "failures"), ")\n");
    for (const std::string& line : report->state_transition_only) {
      absl::StrAppend(&summary, "  state transition only: ", line, "\n");
    }
    if (!report->dead.empty()) {
      absl::StrAppend(&summary, "  dead (computed, never used; checked, not failures): ",
                      absl::StrJoin(report->dead, ", "), "\n");
    }
    if (!report->cut_off.empty()) {
      absl::StrAppend(&summary,
                      "  not reached (the halt cut off what reads them; checked, not dead): ",
                      absl::StrJoin(report->cut_off, ", "), "\n");
    }
    for (const std::string& line : report->unproved) {
      absl::StrAppend(&summary, "  unproved: ", line, "\n");
    }
    if (!report->not_checked.empty()) {
      absl::StrAppend(&summary, "  not checked (nothing saved to re-run them): ",
                      absl::StrJoin(report->not_checked, ", "), "\n");
    }
    for (const std::string& failure : report->failures) {
      absl::StrAppend(&summary, "  FAIL ", failure, "\n");
    }
    if (!report->passed) *exit_code = kAnswerIsNo;
  }
  if (options->validate && trace->records_gradients()) {
    absl::StatusOr<ValidationReport> gradients = ValidateGradients(*trace);
    if (!gradients.ok()) problems.emplace_back(gradients.status().message());
    if (gradients.ok()) {
      json_extra.emplace_back("gradient_validation", ValidationReportToJson(*gradients));
      absl::StrAppend(&summary, "\nGradient validation: ", gradients->passed ? "PASSED" : "FAILED",
                      " (", Count(gradients->ops_checked, "gradient", "gradients"), " checked, ",
                      Count(gradients->failures.size(), "failure", "failures"), ")\n");
      for (const std::string& line : gradients->unproved) {
        absl::StrAppend(&summary, "  unproved: ", line, "\n");
      }
      if (!gradients->not_checked.empty()) {
        absl::StrAppend(&summary, "  not checked (read outside the trace, or not saved): ",
                        absl::StrJoin(gradients->not_checked, ", "), "\n");
      }
      for (const std::string& failure : gradients->failures) {
        absl::StrAppend(&summary, "  FAIL ", failure, "\n");
      }
      if (!gradients->passed) *exit_code = kAnswerIsNo;
    }
  }
  if (options->hash) {
    absl::StrAppend(&summary, "\nStructure hash: ", StructureHash(*trace), "\n");
  }
  if (options->non_finite) {
    absl::StatusOr<std::string> described = DescribeNonFinite(*trace);
    if (described.ok()) absl::StrAppend(&summary, *described);
    if (!described.ok()) problems.emplace_back(described.status().message());
    if (trace->records_gradients()) {
      absl::StatusOr<std::string> gradients = DescribeNonFiniteGradient(*trace);
      if (gradients.ok()) absl::StrAppend(&summary, *gradients);
      if (!gradients.ok()) problems.emplace_back(gradients.status().message());
    }
  }
  for (const std::string& module : options->modules) {
    absl::StatusOr<std::string> calls = DescribeModuleCalls(*trace, module);
    if (calls.ok()) absl::StrAppend(&summary, *calls);
    if (!calls.ok()) problems.push_back(absl::StrCat("--module ", calls.status().message()));
  }
  if (!reference_error.ok()) problems.emplace_back(reference_error.message());
  if (reference.has_value()) {
    // The reference is a, this trace b: differences read "reference vs this run".
    absl::StatusOr<Comparison> comparison = Compare(*reference, *trace);
    if (comparison.ok()) {
      absl::StrAppend(&summary, "\nComparison with ", reference_name, " (a) of this run (b):\n",
                      FormatComparison(*comparison));
      bool params_diverged = false;
      for (const NodeComparison& param : comparison->param_grads) {
        params_diverged = params_diverged || param.grad_diverged;
      }
      if (comparison->first_divergence.has_value() ||
          comparison->first_gradient_divergence.has_value() || params_diverged) {
        *exit_code = kAnswerIsNo;
      }
    } else {
      problems.emplace_back(comparison.status().message());
    }
  }
  if (!options->edits.empty()) {
    absl::StatusOr<std::string> changes = ApplyEdits(*trace, options->edits);
    if (changes.ok()) absl::StrAppend(&summary, *changes);
    if (!changes.ok()) problems.emplace_back(changes.status().message());
  }
  // Every requested output is written even when another one fails; the failures are
  // reported together at the end.
  std::vector<std::string> failed;
  int outputs = 1;  // the summary
  auto output = [&](const std::string& file, absl::string_view written, auto write) {
    if (file.empty()) return;
    ++outputs;
    if (absl::Status s = write(UserPath(file)); s.ok()) {
      absl::StrAppend(&summary, written, " written to ", file, "\n");
    } else {
      failed.emplace_back(s.message());
    }
  };
  output(options->render_file, "\nGraph", [&](const std::string& path) {
    RenderOptions render;
    render.show_buffers = options->show_buffers == "never"    ? ShowBuffers::kNever
                          : options->show_buffers == "always" ? ShowBuffers::kAlways
                                                              : ShowBuffers::kMeaningful;
    render.max_module_depth = options->render_depth;
    render.rolled = options->rolled;
    render.library_branches = options->library_branches;
    return RenderToFile(*trace, path, render);
  });
  output(options->json_file, "JSON",
         [&](const std::string& path) { return WriteJson(*trace, path, json_extra); });
  output(options->chrome_trace, "Chrome trace",
         [&](const std::string& path) { return WriteChromeTrace(*trace, path); });
  output(options->save_file, "Trace file",
         [&](const std::string& path) { return SaveTrace(*trace, path); });
  if (!options->stream_file.empty()) {  // written by the capture
    absl::StrAppend(&summary, "Trace file written to ", options->stream_file,
                    " during the capture\n");
  }
  const absl::Status summary_written =
      options->summary_file.empty()
          ? WriteStdout(summary)
          : WriteFileBytes(UserPath(options->summary_file), summary, "--summary file");
  if (!summary_written.ok()) failed.emplace_back(summary_written.message());
  if (!failed.empty() || !problems.empty()) {
    problems.insert(problems.end(), failed.begin(), failed.end());
    return absl::InvalidArgumentError(absl::StrCat(
        absl::StrJoin(problems, "; "),
        static_cast<int>(failed.size()) < outputs ? " (everything else asked was done)" : ""));
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace torchlens

int main(int argc, char** argv) {
  std::signal(SIGPIPE, SIG_IGN);  // a closed stdout is an error line, not a silent exit
  const std::vector<std::string> args(argv + 1, argv + argc);
  absl::Status status;
  int exit_code = 0;
  // Loading, capturing and replaying a model whose calls nest deep recurse in LibTorch:
  // the whole tool runs on a large stack (NOTE [Calls LibTorch compiles by recursion]).
  absl::Status started = torchlens::RunOnLargeStack([&] {
    try {
      status = torchlens::Run(args, &exit_code);
    } catch (const std::exception& e) {
      status = absl::InternalError(torchlens::MessageOf(e));
    }
  });
  if (!started.ok()) status = started;
  if (status.ok()) return exit_code;
  const std::string message = torchlens::InFlagTerms(status.message());
  std::cerr << "torchlens: error: " << message.substr(0, message.find('\n')) << "\n";
  return 2;
}
