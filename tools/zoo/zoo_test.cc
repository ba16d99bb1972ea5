// The zoo: every torchvision 0.14 model tools/zoo_models.py could export, captured in eval
// and training mode, checked against eager PyTorch and an uncaptured run, validated, and
// its BatchNorm buffers checked. Manual (large): see README "Model zoo".
//
//   /usr/bin/python3 tools/zoo_models.py ~/.cache/torchlens/zoo
//   tools/bazelw test //tools/zoo:zoo_test --test_env=TORCHLENS_ZOO_DIR=$HOME/.cache/torchlens/zoo
//
// Writes a markdown table (model, ops, buffers, verdict, capture cost, peak resident set) to
// $TEST_UNDECLARED_OUTPUTS_DIR/zoo.md and to the log.
#include <dlfcn.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "gtest/gtest.h"
#include "tools/peak_resident.h"
#include "torchlens_dispatch/capture.h"
#include "torchlens_dispatch/load_model.h"
#include "torchlens_dispatch/ops/bit_identical.h"
#include "torchlens_dispatch/ops/ivalue_tensors.h"
#include "torchlens_dispatch/script_runner.h"
#include "validation/validate.h"

namespace torchlens {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<at::Tensor> Flatten(const c10::IValue& value) {
  std::vector<at::Tensor> tensors;
  ForEachTensor(value, [&](const at::Tensor& t) { tensors.push_back(t); });
  return tensors;
}

struct Row {
  std::string model;
  std::string family;
  std::string how;
  int64_t ops = 0;
  size_t buffers = 0;
  double cost = 0;
  int64_t peak_resident = -1;  // bytes, over loading, capturing and validating both modes
  size_t dead = 0;             // eval: nodes validation listed as dead computation
  size_t unproved = 0;         // eval: edges no perturbation could prove
  std::vector<std::string> problems;
};

// Capture cost: median of 5 full captures over median of 5 plain forwards, interleaved,
// after 3 warm-up runs of each (the profiling executor compiles during its first runs).
double CaptureCost(torch::jit::Module& model, torch::jit::Module& twin,
                   const std::vector<c10::IValue>& inputs) {
  for (int i = 0; i < 3; ++i) {
    twin.forward(inputs);
    (void)TraceModule(model, inputs);
  }
  std::vector<double> capture_times, plain_times;
  for (int i = 0; i < 5; ++i) {
    auto start = Clock::now();
    twin.forward(inputs);
    plain_times.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    start = Clock::now();
    (void)TraceModule(model, inputs);
    capture_times.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  std::sort(capture_times.begin(), capture_times.end());
  std::sort(plain_times.begin(), plain_times.end());
  return capture_times[2] / plain_times[2];
}

// The forward's arguments: the exported input, in a list for detection models.
std::vector<c10::IValue> ModelInputs(const torch::jit::Module& values, bool detection) {
  const at::Tensor x = values.attr("input_0").toTensor();
  if (detection) return {c10::List<at::Tensor>({x})};
  return {x};
}

std::string ModeCheck(const std::string& name, const std::string& mode, const std::string& dir,
                      torch::jit::Module& values, bool detection, Row* row) {
  absl::StatusOr<torch::jit::Module> model = LoadTorchScript(absl::StrCat(dir, "/", name, ".pt"));
  if (!model.ok()) return absl::StrCat("load: ", model.status().message());
  absl::StatusOr<torch::jit::Module> twin = LoadTorchScript(absl::StrCat(dir, "/", name, ".pt"));
  model->train(mode == "train");
  twin->train(mode == "train");
  const std::vector<c10::IValue> inputs = ModelInputs(values, detection);
  torch::NoGradGuard no_grad;
  torch::manual_seed(0);
  absl::StatusOr<Trace> trace = TraceModule(*model, inputs);
  if (!trace.ok()) return absl::StrCat(mode, " capture: ", trace.status().message());
  if (mode == "eval") {  // counted before any check, so failing rows show them too
    row->ops = trace->capture_stats().user_ops;
    row->buffers = trace->buffers().size();
  }
  torch::manual_seed(0);
  const std::vector<at::Tensor> plain = Flatten(RunUnoptimized(*twin, inputs));
  std::vector<at::Tensor> captured;
  for (const std::string& label : trace->output_labels()) {
    absl::StatusOr<const Op*> output = trace->Find(label);
    if (!output.ok()) return absl::StrCat(mode, ": ", output.status().message());
    captured.push_back((*output)->out);
  }
  if (captured.size() != plain.size()) {
    return absl::StrCat(mode, ": ", captured.size(), " outputs captured, ", plain.size(),
                        " returned");
  }
  for (size_t i = 0; i < plain.size(); ++i) {
    if (!BitIdentical(captured[i], plain[i]))
      return absl::StrCat(mode, ": output ", i, " differs from the uncaptured run");
    const std::string key = absl::StrCat(mode, "_output_", i);
    if (!values.hasattr(key)) return absl::StrCat(mode, ": no eager output ", i);
    const at::Tensor eager = values.attr(key).toTensor();
    if (eager.sizes() != plain[i].sizes() ||
        !at::allclose(plain[i].to(at::kDouble), eager.to(at::kDouble), 1e-3, 1e-4)) {
      return absl::StrCat(mode, ": output ", i, " differs from eager PyTorch");
    }
  }
  for (const torch::jit::NameTensor& buffer : twin->named_buffers()) {
    const std::string key =
        absl::StrCat(mode, "_buffer__", absl::StrReplaceAll(buffer.name, {{".", "__"}}));
    torch::jit::NameTensor captured_buffer{buffer.name, at::Tensor()};
    for (const torch::jit::NameTensor& b : model->named_buffers()) {
      if (b.name == buffer.name) captured_buffer.value = b.value;
    }
    if (!BitIdentical(captured_buffer.value, buffer.value)) {
      return absl::StrCat(mode, ": buffer ", buffer.name, " differs from the uncaptured run");
    }
    if (values.hasattr(key) &&
        !at::allclose(buffer.value.to(at::kDouble), values.attr(key).toTensor().to(at::kDouble),
                      1e-3, 1e-4)) {
      return absl::StrCat(mode, ": buffer ", buffer.name, " differs from eager PyTorch");
    }
  }
  absl::StatusOr<ValidationReport> report = ValidateForwardPass(*trace);
  if (!report.ok()) return absl::StrCat(mode, " validate: ", report.status().message());
  if (!report->passed) {
    // The log gets every failure (the table row only the first).
    for (const std::string& failure : report->failures) std::cerr << "  " << failure << "\n";
    return absl::StrCat(mode, " validation: ", report->failures.size(),
                        " failures, first: ", report->failures.front());
  }
  if (mode == "eval") {
    row->dead = report->dead.size();
    row->unproved = report->unproved.size();
    for (const std::string& line : report->unproved) std::cerr << "  unproved " << line << "\n";
  }
  // BatchNorm: in training mode each of the three buffers is written once per call.
  std::map<std::string, int> calls;
  for (const Op& op : trace->ops()) {
    if (op.type == "batch_norm") ++calls[op.module_address];
  }
  for (const auto& [address, module] : trace->modules()) {
    if (!absl::StartsWith(module.type_name, "BatchNorm")) continue;
    for (const char* buffer : {"running_mean", "running_var", "num_batches_tracked"}) {
      auto it = trace->buffers().find(absl::StrCat(address, ".", buffer));
      if (it == trace->buffers().end()) continue;
      const int expected = mode == "train" ? calls[address] : 0;
      if (it->second.num_overwrites != expected) {
        return absl::StrCat(mode, ": ", it->first, " has ", it->second.num_overwrites,
                            " writes for ", calls[address], " calls");
      }
    }
  }
  // TORCHLENS_ZOO_NO_COST: skip the 16 timed runs (for models whose forward takes a minute).
  if (mode == "eval" && std::getenv("TORCHLENS_ZOO_NO_COST") == nullptr) {
    row->cost = CaptureCost(*model, *twin, inputs);
  }
  return "";
}

// Detection models call torchvision's operators (nms, roi_align). Debian's
// python3-torchvision ships them in a library that needs only LibTorch: load it.
constexpr char kTorchvisionOps[] =
    "/usr/lib/python3/dist-packages/torchvision/_C.cpython-311-x86_64-linux-gnu.so";

// NOTE [Zoo shards]
// A test runner that spreads tests over machines (Bazel's `shard_count`, locally over the
// cores) sets TEST_TOTAL_SHARDS and TEST_SHARD_INDEX: each shard checks every
// TEST_TOTAL_SHARDS-th model of the selection, writes its own table, and touches
// TEST_SHARD_STATUS_FILE to say it shards. Shards share nothing but the exported models.
// Bazel also sets GTEST_SHARD_INDEX and GTEST_TOTAL_SHARDS, with which GoogleTest deals
// out test cases: the zoo is one test case, which only the first shard would run, so
// main() clears them and the models are dealt here.
struct Shard {
  int index = 0;
  int total = 1;
};

Shard CurrentShard() {
  Shard shard;
  const char* index = std::getenv("TEST_SHARD_INDEX");
  const char* total = std::getenv("TEST_TOTAL_SHARDS");
  if (index != nullptr && total != nullptr && std::atoi(total) > 0) {
    shard.index = std::atoi(index);
    shard.total = std::atoi(total);
  }
  if (const char* status = std::getenv("TEST_SHARD_STATUS_FILE")) std::ofstream(status).flush();
  return shard;
}

TEST(ZooTest, EveryExportedModel) {
  if (dlopen(kTorchvisionOps, RTLD_NOW | RTLD_GLOBAL) == nullptr) {
    std::cerr << "torchvision's operators unavailable: " << dlerror() << "\n";
  }
  const char* dir = std::getenv("TORCHLENS_ZOO_DIR");
  if (dir == nullptr) {
    // `tools/bazelw test //...` runs the shards without the exported zoo, which takes
    // hours to export: they skip (README "Model zoo" says how to run them).
    GTEST_SKIP() << "no zoo: run tools/zoo_models.py DIR, then pass "
                    "--test_env=TORCHLENS_ZOO_DIR=DIR";
  }
  std::ifstream report_file(absl::StrCat(dir, "/report.json"));
  ASSERT_TRUE(report_file.good()) << "no report.json in " << dir;
  const nlohmann::json report = nlohmann::json::parse(report_file);
  at::set_num_threads(1);
  // TORCHLENS_ZOO_SECONDS: start no model after that many seconds (CI runs the zoo in the
  // time it has left); the models not reached are listed as such.
  const char* budget = std::getenv("TORCHLENS_ZOO_SECONDS");
  const double seconds = budget != nullptr ? std::atof(budget) : 1e9;
  const auto start = Clock::now();
  std::vector<Row> rows;
  std::vector<std::string> not_exported;
  std::vector<std::string> not_reached;
  // TORCHLENS_ZOO_ONLY=a,b: just those models.
  const char* only = std::getenv("TORCHLENS_ZOO_ONLY");
  const std::string only_list = only != nullptr ? absl::StrCat(",", only, ",") : "";
  const Shard shard = CurrentShard();
  int selected = 0;
  for (const auto& [name, entry] : report.items()) {
    if (!only_list.empty() && !absl::StrContains(only_list, absl::StrCat(",", name, ","))) continue;
    // NOTE [Zoo shards]: the selected models are dealt round-robin; the unexported ones are
    // listed by shard 0.
    const bool exported = !entry["exported"].is_null();
    if (exported ? selected++ % shard.total != shard.index : shard.index != 0) continue;
    if (!exported) {
      not_exported.push_back(absl::StrCat("| ", name, " | ", entry["family"].get<std::string>(),
                                          " | ", entry["reason"].get<std::string>(), " |"));
      continue;
    }
    if (std::chrono::duration<double>(Clock::now() - start).count() > seconds) {
      not_reached.push_back(name);
      continue;
    }
    Row row;
    row.model = name;
    row.family = entry["family"];
    row.how = entry["exported"];
    torch::jit::Module values = torch::jit::load(absl::StrCat(dir, "/", name, ".expected.pt"));
    const bool detection = row.family == "detection";
    if (std::getenv("TORCHLENS_ZOO_COST_ONLY") != nullptr) {
      // Only the capture cost (for the README table), no checks.
      absl::StatusOr<torch::jit::Module> a = LoadTorchScript(absl::StrCat(dir, "/", name, ".pt"));
      absl::StatusOr<torch::jit::Module> b = LoadTorchScript(absl::StrCat(dir, "/", name, ".pt"));
      if (a.ok() && b.ok()) {
        a->eval();
        b->eval();
        torch::NoGradGuard no_grad;
        row.cost = CaptureCost(*a, *b, ModelInputs(values, detection));
        std::cout << "cost " << name << " " << row.cost << std::endl;  // progress, unbuffered
      }
      rows.push_back(std::move(row));
      continue;
    }
    row.peak_resident = PeakResidentDuring([&] {
      for (const char* mode : {"eval", "train"}) {
        if (detection && std::string(mode) == "train") continue;
        const std::string problem = ModeCheck(name, mode, dir, values, detection, &row);
        if (!problem.empty()) row.problems.push_back(problem);
      }
    });
    EXPECT_TRUE(row.problems.empty()) << name << ": " << absl::StrJoin(row.problems, "; ");
    std::cerr << name << (row.problems.empty() ? " ok" : " FAIL") << "\n";
    rows.push_back(std::move(row));
  }
  std::ostringstream table;
  table << "| model | family | export | ops | buffers | dead | unproved | eval + train | "
           "capture cost | peak RSS |\n"
        << "|---|---|---|---:|---:|---:|---:|---|---:|---:|\n";
  for (const Row& row : rows) {
    table << "| " << row.model << " | " << row.family << " | " << row.how << " | " << row.ops
          << " | " << row.buffers << " | " << row.dead << " | " << row.unproved << " | "
          << (row.problems.empty() ? "validated" : absl::StrJoin(row.problems, "; ")) << " | "
          << (row.cost > 0 ? absl::StrFormat("%.2fx", row.cost) : std::string("n/a")) << " | "
          << (row.peak_resident > 0 ? absl::StrFormat("%.2f GB", row.peak_resident / 1e9)
                                    : std::string("n/a"))
          << " |\n";
  }
  table << "\nNot exported:\n\n| model | family | reason |\n|---|---|---|\n";
  for (const std::string& line : not_exported) table << line << "\n";
  if (!not_reached.empty()) {
    table << "\nNot run within TORCHLENS_ZOO_SECONDS: " << absl::StrJoin(not_reached, ", ") << "\n";
  }
  std::cout << "shard " << shard.index + 1 << " of " << shard.total << ": " << rows.size()
            << " models\n"
            << table.str();
  if (const char* out = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR")) {
    std::ofstream(absl::StrCat(out, "/zoo.md")) << table.str();
  }
}

}  // namespace
}  // namespace torchlens

int main(int argc, char** argv) {
  // See NOTE [Zoo shards].
  unsetenv("GTEST_SHARD_INDEX");
  unsetenv("GTEST_TOTAL_SHARDS");
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
