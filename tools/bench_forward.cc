#include "tools/bench_forward.h"

#include <fcntl.h>
#include <torch/script.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "tools/allocator_peak.h"
#include "tools/bench_memory.h"
#include "tools/bench_timing.h"
#include "tools/bench_validation_floor.h"
#include "tools/output_keeper.h"
#include "tools/peak_resident.h"
#include "torchlens_dispatch/capture.h"
#include "torchlens_dispatch/load_model.h"
#include "torchlens_dispatch/script_runner.h"
#include "validation/intervene.h"
#include "validation/replay.h"
#include "validation/validate.h"

namespace torchlens {
namespace {

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

// What the rows of one model share: the model and its input, the options of the captures,
// and a reference capture.
struct ModelUnderTest {
  torch::jit::Module model;
  std::vector<c10::IValue> inputs;
  CaptureOptions unsaved;
  // CaptureOptions::trace_file, and a plain write loop (what `dd` measures) writing as many
  // bytes into the same folder: the bandwidth reference of the same run.
  std::string disk_file;
  CaptureOptions to_disk;
  bool disk_only = false;
  Trace reference;
  int64_t user_ops = 0;
  const Op* first = nullptr;  // the first and last compute ops with a floating-point value
  const Op* last = nullptr;
  int64_t file_bytes = 0;  // the trace file's size
  int do_last_cone = 0;    // ops Do re-executed
  int do_first_cone = 0;
  std::error_code ignored;  // of removing files that may not exist
};

// Loads `spec`'s model and captures it once; false (having said why) when it cannot.
bool Prepare(const BenchModel& spec, const std::string& models_dir, ModelUnderTest* m) {
  m->model = *LoadTorchScript(absl::StrCat(models_dir, "/", spec.file));
  m->model.train(spec.train);
  torch::manual_seed(0);
  m->inputs = {torch::randn(spec.input_shape)};
  m->unsaved.save_activations = false;
  m->disk_file = absl::StrCat(std::filesystem::temp_directory_path().string(), "/torchlens_bench_",
                              spec.name, ".pt");
  m->to_disk.trace_file = m->disk_file;
  m->disk_only = spec.rows == Rows::kDisk;
  absl::StatusOr<Trace> reference =
      TraceModule(m->model, m->inputs, m->disk_only ? m->to_disk : CaptureOptions());
  if (!reference.ok()) {
    std::cerr << spec.name << ": " << reference.status() << "\n";
    return false;
  }
  m->reference = *std::move(reference);
  m->user_ops = m->reference.capture_stats().user_ops;
  for (const Op& op : m->reference.ops()) {
    if (!op.is_compute() || !op.out.defined() || !op.out.is_floating_point()) continue;
    if (m->first == nullptr) m->first = &op;
    m->last = &op;
  }
  if (spec.rows == Rows::kAll) (void)TraceModule(m->model, m->inputs, m->to_disk);  // its size
  m->file_bytes = static_cast<int64_t>(std::filesystem::file_size(m->disk_file, m->ignored));
  return true;
}

// The rows `spec` gets, plain first; with `only` not empty, those and plain.
std::vector<Config> Configs(const BenchModel& spec, ModelUnderTest& m,
                            const std::vector<std::string>& only) {
  // A captured trace builds its graph when first read (NOTE [Graphs built on first use] in
  // graph/trace.h): the `_graph` rows read it, so they give what a capture costs a caller
  // that looks at the trace on the capturing thread.
  auto capture_and_read = [&m](const CaptureOptions& options) {
    absl::StatusOr<Trace> trace = TraceModule(m.model, m.inputs, options);
    if (trace.ok()) (void)trace->ops();
  };
  std::vector<Config> configs = {
      {"plain", [&m] { m.model.forward(m.inputs); }, {}},
      {"capture_unsaved", [&m] { (void)TraceModule(m.model, m.inputs, m.unsaved); }, {}},
      {"capture_unsaved_graph", [&m, capture_and_read] { capture_and_read(m.unsaved); }, {}},
  };
  if (!m.disk_only) {
    // The private plan captures run through (NOTE [Stable plans]), without capture: how
    // much of a capture's cost is the plan, not the recording.
    configs.push_back({"private_plan", [&m] { RunUnoptimized(m.model, m.inputs); }, {}});
    // What keeping every value costs the private plan without torchlens (output_keeper.h).
    configs.push_back(
        {"keep_outputs",
         [&m] { RunKeepingOutputs([&m] { RunUnoptimized(m.model, m.inputs); }, false); },
         {}});
    configs.push_back(
        {"keep_values",
         [&m] { RunKeepingOutputs([&m] { RunUnoptimized(m.model, m.inputs); }, true); },
         {}});
    configs.push_back({"capture", [&m] { (void)TraceModule(m.model, m.inputs); }, {}});
    configs.push_back(
        {"capture_graph", [capture_and_read] { capture_and_read(CaptureOptions()); }, {}});
  }
  if (spec.rows != Rows::kCaptures) {
    // Each run writes a new file, as a service writing one file per trace does: the last
    // run's file is removed before, untimed (replacing a file costs ext4 a flush of the new
    // one's data at the rename or the truncation).
    configs.push_back({"capture_to_disk",
                       [&m] { (void)TraceModule(m.model, m.inputs, m.to_disk); },
                       {},
                       [&m] { std::filesystem::remove(m.disk_file, m.ignored); }});
    configs.push_back({"write_loop",
                       [&m] { WriteLoop(m.disk_file + ".loop", m.file_bytes); },
                       {},
                       [&m] { std::filesystem::remove(m.disk_file + ".loop", m.ignored); }});
  }
  // Service capture (README "Capture in a service: save less, stop early, bound memory"):
  // one module's values saved, and a forward halted after the first block.
  CaptureOptions save_layer4;
  save_layer4.save_modules = {"layer4"};
  CaptureOptions halt_first_block;
  halt_first_block.halt_after = "layer1.0";
  if (m.reference.modules().count("layer4") > 0 && m.reference.modules().count("layer1.0") > 0) {
    configs.push_back({"capture_layer4",
                       [&m, save_layer4] { (void)TraceModule(m.model, m.inputs, save_layer4); },
                       {}});
    configs.push_back(
        {"halt_layer1.0",
         [&m, halt_first_block] { (void)TraceModule(m.model, m.inputs, halt_first_block); },
         {}});
  }
  if (spec.rows == Rows::kAll) {
    configs.push_back({"validate", [&m] { (void)ValidateForwardPass(m.reference); }, {}});
    // Built once, outside the timing; each timed run copies the argument lists (reference
    // counts) so that a written argument is cloned as validation clones saved values.
    std::shared_ptr<const std::vector<ReplayCall>> floor_calls =
        std::make_shared<const std::vector<ReplayCall>>(ValidationFloorCalls(m.reference));
    configs.push_back({"validate_floor",
                       [floor_calls] {
                         for (const ReplayCall& call : *floor_calls) {
                           (void)ReplayOp(*call.op, call.args);
                         }
                       },
                       {}});
    configs.push_back({"validate_2_threads",
                       [&m] { (void)ValidateForwardPass(m.reference, ValidationOptions{2}); },
                       {}});
    configs.push_back(
        {"do_last_op",
         [&m] {
           absl::StatusOr<DoResult> r = Do(m.reference, {Edit{m.last->label, m.last->out + 1}});
           m.do_last_cone = r.ok() ? static_cast<int>(r->reexecuted.size()) : -1;
         },
         {}});
    configs.push_back(
        {"do_first_op",
         [&m] {
           absl::StatusOr<DoResult> r = Do(m.reference, {Edit{m.first->label, m.first->out + 1}});
           m.do_first_cone = r.ok() ? static_cast<int>(r->reexecuted.size()) : -1;
         },
         {}});
  }
  if (!only.empty()) {  // profiling one row: keep it and the plain forward
    configs.erase(std::remove_if(configs.begin() + 1, configs.end(),
                                 [&](const Config& config) {
                                   return std::find(only.begin(), only.end(), config.name) ==
                                          only.end();
                                 }),
                  configs.end());
  }
  return configs;
}

// Runs every configuration interleaved, after warm-up, `repeats` times (0: chosen from the
// plain forward's time); returns the rounds run.
int TimeConfigs(std::vector<Config>& configs, int repeats, bool disk_only) {
  for (int warm = 0; warm < (disk_only ? 1 : 3); ++warm) {
    for (Config& config : configs) config.run();
  }
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
  return repeats;
}

// Peaks in bytes, each from a run of its own.
struct Memory {
  int64_t plain_peak = 0;
  int64_t saved_bytes = 0;
  int64_t capture_peak = 0;
  int64_t unsaved_peak = 0;
  int64_t disk_peak = 0;
  // The resident set, page cache pages mapped included.
  int64_t plain_resident = 0;
  int64_t disk_resident = 0;
};

Memory MeasureMemory(const BenchModel& spec, ModelUnderTest& m) {
  Memory memory;
  memory.plain_peak = PeakAllocatedDuring([&] { m.model.forward(m.inputs); });
  memory.capture_peak = m.disk_only ? 0 : PeakAllocatedDuring([&] {
    absl::StatusOr<Trace> trace = TraceModule(m.model, m.inputs);
    if (trace.ok()) memory.saved_bytes = SavedBytes(*trace);
  });
  memory.unsaved_peak =
      PeakAllocatedDuring([&] { (void)TraceModule(m.model, m.inputs, m.unsaved); });
  memory.disk_peak = spec.rows == Rows::kCaptures ? 0 : PeakAllocatedDuring([&] {
    (void)TraceModule(m.model, m.inputs, m.to_disk);
  });
  memory.plain_resident = PeakResidentDuring([&] { m.model.forward(m.inputs); });
  memory.disk_resident = spec.rows == Rows::kCaptures ? 0 : PeakResidentDuring([&] {
    (void)TraceModule(m.model, m.inputs, m.to_disk);
  });
  return memory;
}

nlohmann::json ResultRows(const BenchModel& spec, const ModelUnderTest& m,
                          const std::vector<Config>& configs, const Memory& memory, int repeats) {
  const double plain = Median(configs[0].micros);
  nlohmann::json rows = nlohmann::json::array();
  for (const Config& config : configs) {
    const double median = Median(config.micros);
    nlohmann::json row = {{"model", spec.name},         {"config", config.name},
                          {"median_us", median},        {"ratio", median / plain},
                          {"recorded_ops", m.user_ops}, {"repeats", repeats}};
    if (config.name.rfind("capture", 0) == 0) {
      row["added_us_per_op"] = (median - plain) / static_cast<double>(m.user_ops);
    }
    if (config.name == "capture" || config.name == "capture_unsaved") {
      const int64_t peak = config.name == "capture" ? memory.capture_peak : memory.unsaved_peak;
      row["peak_above_plain_bytes"] = peak - memory.plain_peak;
      if (config.name == "capture") {
        row["saved_bytes"] = memory.saved_bytes;
        row["peak_above_plain_over_saved"] =
            memory.saved_bytes > 0
                ? static_cast<double>(peak - memory.plain_peak) / memory.saved_bytes
                : 0.0;
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
      const int64_t file_bytes = m.file_bytes;
      row["saved_bytes"] = file_bytes;
      row["peak_above_plain_bytes"] = memory.disk_peak - memory.plain_peak;
      row["peak_resident_above_plain_bytes"] = memory.disk_resident - memory.plain_resident;
      row["peak_above_plain_over_saved"] =
          file_bytes > 0 ? static_cast<double>(memory.disk_peak - memory.plain_peak) / file_bytes
                         : 0.0;
      row["write_MBps"] = write_seconds > 0 ? file_bytes / write_seconds / 1e6 : 0.0;
      row["write_loop_MBps"] = loop_seconds > 0 ? file_bytes / loop_seconds / 1e6 : 0.0;
      row["bandwidth_vs_write_loop"] =
          row["write_loop_MBps"].get<double>() > 0
              ? row["write_MBps"].get<double>() / row["write_loop_MBps"].get<double>()
              : 0.0;
    }
    if (config.name == "do_last_op") row["reexecuted_ops"] = m.do_last_cone;
    if (config.name == "do_first_op") row["reexecuted_ops"] = m.do_first_cone;
    rows.push_back(row);
  }
  return rows;
}

}  // namespace

nlohmann::json BenchForward(const BenchModel& spec, const std::string& models_dir, int repeats,
                            const std::vector<std::string>& only) {
  torch::NoGradGuard no_grad;
  ModelUnderTest m;
  if (!Prepare(spec, models_dir, &m)) return nullptr;
  std::vector<Config> configs = Configs(spec, m, only);
  repeats = TimeConfigs(configs, repeats, m.disk_only);
  const Memory memory = MeasureMemory(spec, m);
  std::filesystem::remove(m.disk_file, m.ignored);
  std::filesystem::remove(m.disk_file + ".loop", m.ignored);
  return ResultRows(spec, m, configs, memory, repeats);
}

}  // namespace torchlens
