// The torchlens benchmark: what capture, validation and interventions cost, as ratios to
// the plain forward pass measured in the same process and run.
//
//   tools/bazelw run -c opt //tools:bench                       # all models, 1 thread
//   tools/bazelw run -c opt //tools:bench -- --models mlp50 --threads 2 --json out.json
//   tools/bazelw run -c opt //tools:bench -- --models mlp50 --configs do_last_op  # profiling
//   tools/bazelw run -c opt //tools:bench -- --backward --models mlp50,resnet18_train
//
// For each model, every configuration runs interleaved with the others (plain forward,
// capture without saved values, full capture, ValidateForwardPass, Do on the last op, Do on
// the first op), after warm-up; the table reports medians. Everything runs under
// NoGradGuard, at 1 intra-op thread unless --threads says otherwise. Models are TorchScript
// files written by tools/bench_models.py (run automatically into --models_dir when missing).
//
// glibc's malloc adapts its mmap and trim thresholds to the allocation pattern, which
// skews small-model timings 2-4x from run to run; the bench pins both (mallopt) first.
// Every timed run also pays for its own frees: see NOTE [Each run pays for its own frees].
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <fcntl.h>
#include <malloc.h>
#include <torch/script.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "tools/allocator_peak.h"
#include "tools/bench_backward.h"
#include "tools/bench_timing.h"
#include "tools/flag_parser.h"
#include "tools/output_keeper.h"
#include "torchlens_dispatch/capture.h"
#include "torchlens_dispatch/load_model.h"
#include "torchlens_dispatch/ops/ivalue_tensors.h"
#include "torchlens_dispatch/script_runner.h"
#include "validation/corner_replay.h"
#include "validation/intervene.h"
#include "validation/perturbed_tensors.h"
#include "validation/replay.h"
#include "validation/validate.h"
#include "validation/values.h"

namespace torchlens {
namespace {

// Which rows a model gets.
enum class Rows {
  kAll,       // every configuration
  kCaptures,  // plain and captures (scaling and small-op models)
  kDisk,      // plain, capture without saved values, and capture to disk (large model)
};

struct BenchModel {
  std::string name;
  std::string file;
  bool train;
  std::vector<int64_t> input_shape;
  Rows rows;
};

const std::vector<BenchModel>& Models() {
  static const std::vector<BenchModel> models = {
      {"mlp50", "mlp50.pt", false, {1, 16}, Rows::kAll},
      {"resnet18_eval", "resnet18.pt", false, {1, 3, 224, 224}, Rows::kAll},
      {"resnet18_train", "resnet18.pt", true, {1, 3, 224, 224}, Rows::kAll},
      {"recurrent100", "recurrent.pt", false, {1, 32}, Rows::kAll},
      {"transformer", "transformer.pt", false, {1, 16, 64}, Rows::kAll},
      // Many small ops (issue 21's small-op models): capture rows only.
      {"shufflenet_v2_x1_0", "shufflenet_v2_x1_0.pt", false, {1, 3, 224, 224}, Rows::kCaptures},
      {"mobilenet_v2", "mobilenet_v2.pt", false, {1, 3, 224, 224}, Rows::kCaptures},
      {"mlp200", "mlp200.pt", false, {1, 16}, Rows::kCaptures},
      {"mlp2000", "mlp2000.pt", false, {1, 16}, Rows::kCaptures},
      {"mlp200_tied", "mlp200_tied.pt", false, {1, 16}, Rows::kCaptures},
      {"mlp2000_tied", "mlp2000_tied.pt", false, {1, 16}, Rows::kCaptures},
      // Saved values of over 4 GB (issue 19), captured to disk only: --models resnet152_b32.
      {"resnet152_b32", "resnet152.pt", false, {32, 3, 224, 224}, Rows::kDisk},
  };
  return models;
}

// Peak resident set of the process while `run` runs, in bytes: the kernel's high-water
// mark, reset first (writing 5 to /proc/self/clear_refs), so that it counts the page cache
// pages a run maps and touches as well as its heap. -1 when the kernel does not allow it.
int64_t PeakResidentDuring(const std::function<void()>& run) {
  {
    std::ofstream clear("/proc/self/clear_refs");
    clear << "5";
    if (!clear.good()) return -1;
  }
  run();
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    int64_t kb = 0;
    if (line.rfind("VmHWM:", 0) == 0 &&
        absl::SimpleAtoi(absl::StripAsciiWhitespace(absl::StripSuffix(line.substr(6), "kB")),
                         &kb)) {
      return kb * 1024;
    }
  }
  return -1;
}

// Bytes of the distinct storages a trace holds that capture allocated (activations,
// buffer snapshots, generator states), not the parameters or inputs it references.
int64_t SavedBytes(const Trace& trace) {
  absl::flat_hash_set<const void*> excluded;
  for (const Op& op : trace.ops()) {
    if (op.is_input() && op.out.defined()) excluded.insert(op.out.storage().unsafeGetStorageImpl());
    int index = 0;
    for (const c10::IValue& arg : op.creation_args) {
      ForEachTensor(arg, [&](const at::Tensor& t) {
        if (index < static_cast<int>(op.arg_sources.size()) && t.defined() && t.has_storage() &&
            op.arg_sources[index].kind == ArgSource::Kind::kParam) {
          excluded.insert(t.storage().unsafeGetStorageImpl());
        }
        ++index;
      });
    }
  }
  absl::flat_hash_set<const void*> counted;
  int64_t bytes = 0;
  auto count = [&](const at::Tensor& t) {
    if (!t.defined() || !t.has_storage()) return;
    const void* storage = t.storage().unsafeGetStorageImpl();
    if (excluded.contains(storage) || !counted.insert(storage).second) return;
    bytes += static_cast<int64_t>(t.storage().nbytes());
  };
  for (const Op& op : trace.ops()) {
    for (const at::Tensor& t : op.outs) count(t);
    count(op.out);
    count(op.rng_state);
    for (const c10::IValue& arg : op.creation_args) ForEachTensor(arg, count);
  }
  for (const auto& [address, buffer] : trace.buffers()) count(buffer.initial_value);
  return bytes;
}

struct Config {
  std::string name;
  std::function<void()> run;
  std::vector<double> micros;
  std::function<void()> before;  // untimed, before each run (or null)
};

// Writes `bytes` bytes to `path` in 1 MiB writes and closes it (the bandwidth `dd
// bs=1M` reaches, through the page cache as the trace file's writes go).
void WriteLoop(const std::string& path, int64_t bytes) {
  static const std::vector<char> chunk(1 << 20, 'x');
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return;
  for (int64_t left = bytes; left > 0;) {
    const ssize_t written =
        ::write(fd, chunk.data(), static_cast<size_t>(std::min<int64_t>(left, chunk.size())));
    if (written <= 0) break;
    left -= written;
  }
  ::close(fd);
}

struct Options {
  std::string models_dir;
  std::vector<std::string> only;
  std::vector<std::string> configs;  // --configs: these rows and "plain" (all when empty)
  int threads = 1;
  int repeats = 0;  // 0: chosen per model
  std::string json_file;
  bool backward = false;  // --backward: the gradient rows (bench_backward.h) only
};

// Whether --models leaves `name` in (all models when it is not given).
bool Selected(const Options& options, const std::string& name) {
  return options.only.empty() ||
         std::find(options.only.begin(), options.only.end(), name) != options.only.end();
}

absl::StatusOr<Options> ParseOptions(int argc, char** argv) {
  Options options;
  const char* home = std::getenv("HOME");
  options.models_dir = absl::StrCat(home ? home : "/tmp", "/.cache/torchlens/bench-models");
  FlagParser flags;
  flags.String("models_dir", &options.models_dir);
  flags.List("models", &options.only);
  flags.List("configs", &options.configs);
  flags.Int("threads", &options.threads, 1);
  flags.Int("repeats", &options.repeats, 1);
  flags.String("json", &options.json_file);
  flags.Switch("backward", &options.backward);
  if (absl::Status parsed = flags.Parse(argc, argv); !parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(parsed.message(),
                     "; flags: --models a,b --configs a,b --threads "
                     "N --repeats N --json FILE --models_dir DIR --backward"));
  }
  return options;
}

absl::Status EnsureModels(const std::string& dir) {
  bool missing = false;
  for (const BenchModel& model : Models()) {
    missing = missing || !std::ifstream(absl::StrCat(dir, "/", model.file)).good();
  }
  if (!missing) return absl::OkStatus();
  std::cerr << "bench: writing models into " << dir << " (tools/bench_models.py)\n";
  const std::string command = absl::StrCat("/usr/bin/python3 tools/bench_models.py '", dir, "'");
  if (std::system(command.c_str()) != 0) {
    return absl::InternalError(
        absl::StrCat("`", command,
                     "` failed; python3-torch and "
                     "python3-torchvision are needed (tools/bazelw installs them)"));
  }
  return absl::OkStatus();
}

// The kernel calls validation cannot avoid (README "Validation", its cost): each op with
// saved values once on its saved arguments, and once more per parent whose perturbation it
// checks, with that parent's tensors (PerturbedTensorsByParent, as validation picks them)
// replaced by their first perturbation; for an op with a corner (NOTE [Perturbing a
// corner]) the perturbed run is the run on the corner pair. Built before
// timing, so the floor row times the calls alone.
struct ReplayCall {
  const Op* op;
  std::vector<c10::IValue> args;
};
std::vector<ReplayCall> ValidationFloorCalls(const Trace& trace) {
  std::vector<ReplayCall> calls;
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(1);
  for (const Op& op : trace.ops()) {
    if (!op.is_compute() || !op.saved()) continue;
    calls.push_back({&op, CapturedArguments(op)});
    const std::vector<std::vector<int>> perturbed_tensors = PerturbedTensorsByParent(op);
    const std::optional<Corner> corner = FindCorner(op);
    for (const std::vector<int>& indexes : perturbed_tensors) {
      const auto first_perturbation = [&](const at::Tensor& t) {
        return Perturbation(t, 0, [&]() -> at::Generator& { return generator; });
      };
      if (corner.has_value()) {
        if (std::optional<std::vector<c10::IValue>> pair =
                CornerPairArguments(op, *corner, indexes, first_perturbation)) {
          calls.push_back({&op, *std::move(pair)});
          continue;
        }
      }
      bool perturbed = false;
      std::vector<c10::IValue> args =
          ReplayArguments(op, [&](int index, const ArgSource&, const at::Tensor& t) {
            if (std::find(indexes.begin(), indexes.end(), index) == indexes.end() || !t.defined() ||
                t.numel() == 0) {
              return t;
            }
            std::optional<at::Tensor> changed = first_perturbation(t);
            perturbed = perturbed || changed.has_value();
            return changed.value_or(t);
          });
      if (perturbed) calls.push_back({&op, std::move(args)});
    }
  }
  return calls;
}

nlohmann::json BenchOne(const BenchModel& spec, const Options& options) {
  torch::jit::Module model = *LoadTorchScript(absl::StrCat(options.models_dir, "/", spec.file));
  model.train(spec.train);
  torch::manual_seed(0);
  const std::vector<c10::IValue> inputs = {torch::randn(spec.input_shape)};
  torch::NoGradGuard no_grad;

  CaptureOptions unsaved;
  unsaved.save_activations = false;
  // CaptureOptions::trace_file, and a plain write loop (what `dd` measures) writing as many
  // bytes into the same folder: the bandwidth reference of the same run.
  const std::string disk_file = absl::StrCat(std::filesystem::temp_directory_path().string(),
                                             "/torchlens_bench_", spec.name, ".pt");
  CaptureOptions to_disk;
  to_disk.trace_file = disk_file;
  const bool disk_only = spec.rows == Rows::kDisk;
  absl::StatusOr<Trace> reference =
      TraceModule(model, inputs, disk_only ? to_disk : CaptureOptions());
  if (!reference.ok()) {
    std::cerr << spec.name << ": " << reference.status() << "\n";
    return nullptr;
  }
  const int64_t user_ops = reference->capture_stats().user_ops;
  const Op* first = nullptr;
  const Op* last = nullptr;
  for (const Op& op : reference->ops()) {
    if (!op.is_compute() || !op.out.defined() || !op.out.is_floating_point()) continue;
    if (first == nullptr) first = &op;
    last = &op;
  }
  int do_last_cone = 0;
  int do_first_cone = 0;

  std::error_code size_error;
  if (spec.rows == Rows::kAll) (void)TraceModule(model, inputs, to_disk);  // the file's size
  const int64_t file_bytes =
      static_cast<int64_t>(std::filesystem::file_size(disk_file, size_error));
  // A captured trace builds its graph when first read (NOTE [Graphs built on first use] in
  // graph/trace.h): the `_graph` rows read it, so they give what a capture costs a caller
  // that looks at the trace on the capturing thread.
  auto capture_and_read = [&](const CaptureOptions& options) {
    absl::StatusOr<Trace> trace = TraceModule(model, inputs, options);
    if (trace.ok()) (void)trace->ops();
  };
  std::vector<Config> configs = {
      {"plain", [&] { model.forward(inputs); }, {}},
      {"capture_unsaved", [&] { (void)TraceModule(model, inputs, unsaved); }, {}},
      {"capture_unsaved_graph", [&] { capture_and_read(unsaved); }, {}},
  };
  if (!disk_only) {
    // The private plan captures run through (NOTE [Stable plans]), without capture: how
    // much of a capture's cost is the plan, not the recording.
    configs.push_back({"private_plan", [&] { RunUnoptimized(model, inputs); }, {}});
    // What keeping every value costs the private plan without torchlens (output_keeper.h).
    configs.push_back({"keep_outputs",
                       [&] { RunKeepingOutputs([&] { RunUnoptimized(model, inputs); }, false); },
                       {}});
    configs.push_back({"keep_values",
                       [&] { RunKeepingOutputs([&] { RunUnoptimized(model, inputs); }, true); },
                       {}});
    configs.push_back({"capture", [&] { (void)TraceModule(model, inputs); }, {}});
    configs.push_back({"capture_graph", [&] { capture_and_read(CaptureOptions()); }, {}});
  }
  if (spec.rows != Rows::kCaptures) {
    // Each run writes a new file, as a service writing one file per trace does: the last
    // run's file is removed before, untimed (replacing a file costs ext4 a flush of the new
    // one's data at the rename or the truncation, 26-29 ms for ResNet-18's 80 MB).
    configs.push_back({"capture_to_disk",
                       [&] { (void)TraceModule(model, inputs, to_disk); },
                       {},
                       [&] { std::filesystem::remove(disk_file, size_error); }});
    configs.push_back({"write_loop",
                       [&] { WriteLoop(disk_file + ".loop", file_bytes); },
                       {},
                       [&] { std::filesystem::remove(disk_file + ".loop", size_error); }});
  }
  // Service capture (README "Capture in a service: save less, stop early, bound memory"):
  // one module's values saved, and a forward halted after the first block.
  CaptureOptions save_layer4;
  save_layer4.save_modules = {"layer4"};
  CaptureOptions halt_first_block;
  halt_first_block.halt_after = "layer1.0";
  if (reference->modules().count("layer4") > 0 && reference->modules().count("layer1.0") > 0) {
    configs.push_back(
        {"capture_layer4", [&] { (void)TraceModule(model, inputs, save_layer4); }, {}});
    configs.push_back(
        {"halt_layer1.0", [&] { (void)TraceModule(model, inputs, halt_first_block); }, {}});
  }
  if (spec.rows == Rows::kAll) {
    configs.push_back({"validate", [&] { (void)ValidateForwardPass(*reference); }, {}});
    // Built once, outside the timing; each timed run copies the argument lists (reference
    // counts) so that a written argument is cloned as validation clones saved values.
    std::shared_ptr<const std::vector<ReplayCall>> floor_calls =
        std::make_shared<const std::vector<ReplayCall>>(ValidationFloorCalls(*reference));
    configs.push_back({"validate_floor",
                       [floor_calls] {
                         for (const ReplayCall& call : *floor_calls) {
                           (void)ReplayOp(*call.op, call.args);
                         }
                       },
                       {}});
    configs.push_back({"validate_2_threads",
                       [&] { (void)ValidateForwardPass(*reference, ValidationOptions{2}); },
                       {}});
    configs.push_back(
        {"do_last_op",
         [&] {
           absl::StatusOr<DoResult> r = Do(*reference, {Edit{last->label, last->out + 1}});
           do_last_cone = r.ok() ? static_cast<int>(r->reexecuted.size()) : -1;
         },
         {}});
    configs.push_back(
        {"do_first_op",
         [&] {
           absl::StatusOr<DoResult> r = Do(*reference, {Edit{first->label, first->out + 1}});
           do_first_cone = r.ok() ? static_cast<int>(r->reexecuted.size()) : -1;
         },
         {}});
  }
  if (!options.configs.empty()) {  // profiling one row: keep it and the plain forward
    configs.erase(std::remove_if(configs.begin() + 1, configs.end(),
                                 [&](const Config& config) {
                                   return std::find(options.configs.begin(), options.configs.end(),
                                                    config.name) == options.configs.end();
                                 }),
                  configs.end());
  }
  for (int warm = 0; warm < (disk_only ? 1 : 3); ++warm) {
    for (Config& config : configs) config.run();
  }
  int repeats = options.repeats;
  if (repeats == 0 && disk_only) repeats = 3;  // a minute per round
  if (repeats == 0) {
    const double plain = MicrosOf(configs[0].run) / 1e6;  // seconds
    repeats = static_cast<int>(std::clamp(6.0 / (plain * 6 + 1e-9), 9.0, 301.0));
  }
  for (int r = 0; r < repeats; ++r) {
    for (Config& config : configs) {
      if (config.before) config.before();
      config.micros.push_back(MicrosOf(config.run));
    }
  }

  // Memory, in separate runs.
  const int64_t plain_peak = PeakAllocatedDuring([&] { model.forward(inputs); });
  int64_t saved_bytes = 0;
  const int64_t capture_peak = disk_only ? 0 : PeakAllocatedDuring([&] {
    absl::StatusOr<Trace> trace = TraceModule(model, inputs);
    if (trace.ok()) saved_bytes = SavedBytes(*trace);
  });
  const int64_t unsaved_peak =
      PeakAllocatedDuring([&] { (void)TraceModule(model, inputs, unsaved); });
  const int64_t disk_peak = spec.rows == Rows::kCaptures ? 0 : PeakAllocatedDuring([&] {
    (void)TraceModule(model, inputs, to_disk);
  });
  // And the resident set, page cache pages mapped included.
  const int64_t plain_resident = PeakResidentDuring([&] { model.forward(inputs); });
  const int64_t disk_resident = spec.rows == Rows::kCaptures ? 0 : PeakResidentDuring([&] {
    (void)TraceModule(model, inputs, to_disk);
  });
  std::filesystem::remove(disk_file, size_error);
  std::filesystem::remove(disk_file + ".loop", size_error);

  const double plain = Median(configs[0].micros);
  nlohmann::json rows = nlohmann::json::array();
  for (const Config& config : configs) {
    const double median = Median(config.micros);
    nlohmann::json row = {{"model", spec.name},       {"config", config.name},
                          {"median_us", median},      {"ratio", median / plain},
                          {"recorded_ops", user_ops}, {"repeats", repeats}};
    if (config.name.rfind("capture", 0) == 0) {
      row["added_us_per_op"] = (median - plain) / static_cast<double>(user_ops);
    }
    if (config.name == "capture" || config.name == "capture_unsaved") {
      const int64_t peak = config.name == "capture" ? capture_peak : unsaved_peak;
      row["peak_above_plain_bytes"] = peak - plain_peak;
      if (config.name == "capture") {
        row["saved_bytes"] = saved_bytes;
        row["peak_above_plain_over_saved"] =
            saved_bytes > 0 ? static_cast<double>(peak - plain_peak) / saved_bytes : 0.0;
      }
    }
    if (config.name == "capture_to_disk") {
      // The file's bytes over the time the capture spent beyond one without saved values,
      // against the write loop's bandwidth; peak allocation above plain over those bytes.
      auto median_of = [&](const char* name) {
        for (const Config& other : configs) {
          if (other.name == name) return Median(other.micros);
        }
        return 0.0;
      };
      const double write_seconds = (median - median_of("capture_unsaved_graph")) / 1e6;
      const double loop_seconds = median_of("write_loop") / 1e6;
      row["saved_bytes"] = file_bytes;
      row["peak_above_plain_bytes"] = disk_peak - plain_peak;
      row["peak_resident_above_plain_bytes"] = disk_resident - plain_resident;
      row["peak_above_plain_over_saved"] =
          file_bytes > 0 ? static_cast<double>(disk_peak - plain_peak) / file_bytes : 0.0;
      row["write_MBps"] = write_seconds > 0 ? file_bytes / write_seconds / 1e6 : 0.0;
      row["write_loop_MBps"] = loop_seconds > 0 ? file_bytes / loop_seconds / 1e6 : 0.0;
      row["bandwidth_vs_write_loop"] =
          row["write_loop_MBps"].get<double>() > 0
              ? row["write_MBps"].get<double>() / row["write_loop_MBps"].get<double>()
              : 0.0;
    }
    if (config.name == "do_last_op") row["reexecuted_ops"] = do_last_cone;
    if (config.name == "do_first_op") row["reexecuted_ops"] = do_first_cone;
    rows.push_back(row);
  }
  return rows;
}

// Per-op cost of `large` over `small` (the same layers, 10x as many), in blocks: each
// block runs one model's plain forward and capture (without saved values) alternately,
// warm (one discarded iteration), and keeps their medians; blocks alternate between the
// models, and each pair of blocks gives the ratios. The machine's slow drift over the run
// (other tenants of a shared L3) then moves both sides of a ratio alike, while each model
// is measured in the steady state a service runs it in. The median pair is reported.
nlohmann::json ScalingPair(const BenchModel& small, const BenchModel& large, const Options& options,
                           bool consolidate_frees) {
  struct Side {
    torch::jit::Module model;
    std::vector<c10::IValue> inputs;
    double ops = 0;
    double plain = 0, capture = 0;  // medians of this round's block, microseconds
  };
  CaptureOptions unsaved;
  unsaved.save_activations = false;
  torch::NoGradGuard no_grad;
  std::vector<Side> sides;
  for (const BenchModel* spec : {&small, &large}) {
    absl::StatusOr<torch::jit::Module> model =
        LoadTorchScript(absl::StrCat(options.models_dir, "/", spec->file));
    if (!model.ok()) return nullptr;
    model->train(spec->train);
    torch::manual_seed(0);
    Side side{*model, {torch::randn(spec->input_shape)}};
    absl::StatusOr<Trace> trace = TraceModule(side.model, side.inputs, unsaved);
    if (!trace.ok()) return nullptr;
    side.ops = static_cast<double>(trace->capture_stats().user_ops);
    sides.push_back(std::move(side));
  }
  std::vector<double> capture_ratios, plain_ratios, added_ratios;
  constexpr int kPerBlock = 11;
  const int rounds = options.repeats > 0 ? options.repeats : 9;
  for (int round = -1; round < rounds; ++round) {  // one warm-up round
    for (Side& side : sides) {
      std::vector<double> plain, capture;
      for (int i = -1; i < kPerBlock; ++i) {
        const double p = MicrosOf([&] { side.model.forward(side.inputs); }, consolidate_frees);
        const double c = MicrosOf([&] { (void)TraceModule(side.model, side.inputs, unsaved); },
                                  consolidate_frees);
        if (i < 0) continue;
        plain.push_back(p);
        capture.push_back(c);
      }
      side.plain = Median(plain);
      side.capture = Median(capture);
    }
    if (round < 0) continue;
    const Side& a = sides[0];
    const Side& b = sides[1];
    capture_ratios.push_back((b.capture / b.ops) / (a.capture / a.ops));
    plain_ratios.push_back((b.plain / b.ops) / (a.plain / a.ops));
    added_ratios.push_back(((b.capture - b.plain) / b.ops) / ((a.capture - a.plain) / a.ops));
  }
  return {{"model", absl::StrCat(large.name, "/", small.name)},
          {"config", "scaling"},
          {"frees", consolidate_frees ? "each run's own" : "left to glibc"},
          {"capture_per_op_ratio", Median(capture_ratios)},
          {"plain_per_op_ratio", Median(plain_ratios)},
          {"added_per_op_ratio", Median(added_ratios)},
          {"repeats", rounds}};
}

void PrintTable(const nlohmann::json& rows) {
  std::cout << absl::StrFormat("%-15s %-21s %12s %8s %10s %7s %12s %10s %8s\n", "model", "config",
                               "median_us", "ratio", "us/op+", "ops", "peak+ MB", "saved MB",
                               "peak+/sv");
  for (const nlohmann::json& row : rows) {
    auto number = [&](const char* key, const char* format) -> std::string {
      return row.contains(key) ? absl::StrFormat(format, row[key].get<double>()) : "";
    };
    std::string ops = absl::StrCat(row["recorded_ops"].get<int64_t>());
    if (row.contains("reexecuted_ops")) ops = absl::StrCat(row["reexecuted_ops"].get<int>(), " re");
    std::cout << absl::StrFormat(
        "%-15s %-21s %12.1f %7.3fx %10s %7s %12s %10s %8s\n", row["model"].get<std::string>(),
        row["config"].get<std::string>(), row["median_us"].get<double>(),
        row["ratio"].get<double>(), number("added_us_per_op", "%.3f"), ops,
        row.contains("peak_above_plain_bytes")
            ? absl::StrFormat("%.2f", row["peak_above_plain_bytes"].get<double>() / 1e6)
            : "",
        row.contains("saved_bytes")
            ? absl::StrFormat("%.2f", row["saved_bytes"].get<double>() / 1e6)
            : "",
        number("peak_above_plain_over_saved", "%.3f"));
  }
  for (const nlohmann::json& row : rows) {
    if (!row.contains("write_MBps")) continue;
    std::cout << absl::StrFormat(
        "%-15s capture_to_disk wrote %.1f MB at %.0f MB/s (the capture's time beyond "
        "capture_unsaved_graph); write loop %.0f MB/s; ratio %.2f; peak resident set above plain "
        "%.1f MB\n",
        row["model"].get<std::string>(), row["saved_bytes"].get<double>() / 1e6,
        row["write_MBps"].get<double>(), row["write_loop_MBps"].get<double>(),
        row["bandwidth_vs_write_loop"].get<double>(),
        row["peak_resident_above_plain_bytes"].get<double>() / 1e6);
  }
}

}  // namespace
}  // namespace torchlens

int main(int argc, char** argv) {
  using namespace torchlens;
  // See the file comment: pin glibc's adaptive thresholds.
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  absl::StatusOr<Options> options = ParseOptions(argc, argv);
  if (!options.ok()) {
    std::cerr << "bench: " << options.status().message() << "\n";
    return 2;
  }
  options->models_dir = UserPath(options->models_dir);
  if (absl::Status s = EnsureModels(options->models_dir); !s.ok()) {
    std::cerr << "bench: " << s.message() << "\n";
    return 2;
  }
  at::set_num_threads(options->threads);
#ifndef __OPTIMIZE__
  // `bazel-bin/tools/bench` after a `bazel test` is the fastbuild binary: torchlens' own
  // code at -O0 against an optimized LibTorch, which makes capture look slow and its
  // scaling look flat.
  std::cout << "WARNING: this bench was built without optimization, so its ratios do not "
               "describe torchlens; run tools/bazelw run -c opt //tools:bench\n";
#endif
  std::cout << "torchlens bench: " << options->threads << " intra-op thread(s), medians; "
            << "malloc thresholds pinned (M_MMAP_THRESHOLD 64 MiB, M_TRIM_THRESHOLD 256 MiB), "
               "each timed run consolidates its own frees\n";
  nlohmann::json all = nlohmann::json::array();
  if (options->backward) {
    // Forward and backward, with and without save_grads (bench_backward.h).
    for (const BenchModel& model : Models()) {
      if (!Selected(*options, model.name) || model.rows != Rows::kAll) continue;
      absl::StatusOr<torch::jit::Module> loaded =
          LoadTorchScript(absl::StrCat(options->models_dir, "/", model.file));
      if (!loaded.ok()) return 1;
      loaded->train(model.train);
      torch::manual_seed(0);
      nlohmann::json rows = BenchBackward(model.name, *loaded, {torch::randn(model.input_shape)},
                                          options->repeats, options->configs);
      if (rows.is_null()) return 1;
      PrintTable(rows);
      for (const nlohmann::json& row : rows) {
        if (row.contains("passed")) {
          std::cout << model.name
                    << " ValidateGradients: " << (row["passed"].get<bool>() ? "PASSED" : "FAILED")
                    << " (" << row["gradients_checked"].get<int>() << " gradients checked)\n";
        }
      }
      std::cout.flush();
      for (nlohmann::json& row : rows) all.push_back(row);
    }
    if (!options->json_file.empty()) {
      std::ofstream(UserPath(options->json_file)) << all.dump(2) << "\n";
    }
    return 0;
  }
  for (const BenchModel& model : Models()) {
    if (!Selected(*options, model.name)) continue;
    nlohmann::json rows = BenchOne(model, *options);
    if (rows.is_null()) return 1;
    PrintTable(rows);
    std::cout.flush();
    for (nlohmann::json& row : rows) all.push_back(row);
  }
  // Scaling: per-op cost at 2,000 layers against 200. The tied pair shares one layer's
  // weights, so that its memory does not grow with its depth: it separates the capture's
  // own scaling from the model's leaving the cache (README "Performance").
  auto spec = [](const std::string& name) -> const BenchModel* {
    for (const BenchModel& model : Models()) {
      if (model.name == name) return &model;
    }
    return nullptr;
  };
  // Both ways of charging glibc's deferred frees: NOTE [Each run pays for its own frees].
  for (const bool consolidate_frees : {true, false}) {
    for (const auto& [small, large] : {std::pair<std::string, std::string>{"mlp200", "mlp2000"},
                                       {"mlp200_tied", "mlp2000_tied"}}) {
      if (!Selected(*options, large)) continue;
      nlohmann::json row = ScalingPair(*spec(small), *spec(large), *options, consolidate_frees);
      if (row.is_null()) {
        std::cerr << "bench: could not measure " << large << " against " << small << "\n";
        return 1;
      }
      std::cout << absl::StrFormat(
          "scaling %s (per-op cost, median of %d pairs of blocks, frees %s): captured forward "
          "%.3fx, plain forward %.3fx, added by capture %.3fx\n",
          row["model"].get<std::string>(), row["repeats"].get<int>(),
          row["frees"].get<std::string>(), row["capture_per_op_ratio"].get<double>(),
          row["plain_per_op_ratio"].get<double>(), row["added_per_op_ratio"].get<double>());
      all.push_back(row);
    }
  }
  if (!options->json_file.empty()) {
    std::ofstream(UserPath(options->json_file)) << all.dump(2) << "\n";
  }
  return 0;
}
