// An example service: loads a TorchScript model once, serves a batch of requests from a
// worker pool, and captures the requests marked for it (see service.h).
//
//   tools/bazelw run //tools/serve:serve_example -- --requests 16 --capture 3,7
//
// serves 16 requests on --workers threads (default 4) and writes the traces of requests 3
// and 7 under --out_dir (default /tmp/torchlens-serve). Sampling: --capture_one_in N
// captures one request in N as well, --max_traces_kept K keeps the newest K traces,
// --max_trace_bytes B bounds each trace's saved values (partial traces beyond).
//
// Requests are generated (seeded random inputs of --input_shape), or read from --input_dir
// (files NAME.pt written by torch.save, served in name order). Each answer prints one line.
#include <dirent.h>
#include <sys/stat.h>
#include <torch/serialize.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "graph/torch_load.h"
#include "tools/cli_flags.h"
#include "tools/flag_parser.h"
#include "tools/serve/service.h"
#include "torchlens_dispatch/load_model.h"

namespace {

int Fail(const std::string& message) {
  std::cerr << "serve_example: error: " << message << "\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path = "testdata/convbn_eval.pt";
  std::string input_shape = "2,1,5,5";
  std::string input_dir;
  std::string out_dir = "/tmp/torchlens-serve";
  int requests = 12;
  int workers = 4;
  std::set<int> capture = {2, 7};
  torchlens::FlagParser flags;
  flags.String("model", &model_path);
  flags.String("input_shape", &input_shape);
  flags.String("input_dir", &input_dir);
  flags.String("out_dir", &out_dir);
  flags.Int("requests", &requests, 1);
  flags.Int("workers", &workers, 1);
  torchlens::serve::ServiceOptions options;
  flags.Int("capture_one_in", &options.capture_one_in, 0);
  flags.Int("max_traces_kept", &options.max_traces_kept, 0);
  flags.Int("max_trace_bytes", &options.max_trace_bytes, 0);
  flags.Value("capture", [&](absl::string_view value) {
    capture.clear();
    for (absl::string_view id : absl::StrSplit(value, ',', absl::SkipEmpty())) {
      int n = 0;
      if (!absl::SimpleAtoi(id, &n)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--capture: \"", id, "\" is not a request id"));
      }
      capture.insert(n);
    }
    return absl::OkStatus();
  });
  if (absl::Status parsed = flags.Parse(argc, argv); !parsed.ok()) {
    return Fail(
        absl::StrCat(parsed.message(),
                     "; flags: --model --input_shape --input_dir --out_dir --requests "
                     "--workers --capture --capture_one_in --max_traces_kept --max_trace_bytes"));
  }
  model_path = torchlens::UserPath(model_path);
  if (!input_dir.empty()) input_dir = torchlens::UserPath(input_dir);
  out_dir = torchlens::UserPath(out_dir);
  absl::StatusOr<torch::jit::Module> model = torchlens::LoadTorchScript(model_path);
  if (!model.ok()) return Fail(std::string(model.status().message()));
  model->eval();
  ::mkdir(out_dir.c_str(), 0755);

  std::vector<torchlens::serve::Request> batch;
  if (!input_dir.empty()) {
    std::vector<std::string> names;
    if (DIR* dir = ::opendir(input_dir.c_str())) {
      while (dirent* entry = ::readdir(dir)) {
        const std::string name = entry->d_name;
        if (name.size() > 3 && name.substr(name.size() - 3) == ".pt") names.push_back(name);
      }
      ::closedir(dir);
    } else {
      return Fail(absl::StrCat("cannot read --input_dir '", input_dir, "'"));
    }
    std::sort(names.begin(), names.end());
    for (const std::string& name : names) {
      absl::StatusOr<c10::IValue> value =
          torchlens::LoadTorchSaved(absl::StrCat(input_dir, "/", name), "input file");
      if (!value.ok()) return Fail(std::string(value.status().message()));
      if (!value->isTensor()) return Fail(absl::StrCat(name, " does not hold one tensor"));
      const int id = static_cast<int>(batch.size());
      batch.push_back({id, value->toTensor(), capture.count(id) > 0});
    }
  } else {
    absl::StatusOr<std::vector<std::vector<int64_t>>> shapes =
        torchlens::ParseInputShapes(input_shape);
    if (!shapes.ok() || shapes->size() != 1) return Fail("--input_shape: one shape, e.g. 2,1,5,5");
    torch::manual_seed(0);
    for (int id = 0; id < requests; ++id) {
      batch.push_back({id, torch::randn(shapes->front()), capture.count(id) > 0});
    }
  }

  options.workers = workers;
  options.out_dir = out_dir;
  torchlens::serve::Service service(*std::move(model), options);
  const std::vector<torchlens::serve::Answer> answers = service.Serve(batch);
  int failures = 0;
  for (const torchlens::serve::Answer& answer : answers) {
    std::cout << "request " << answer.id << ": ";
    if (!answer.output.defined()) {
      std::cout << "failed: " << answer.status.message() << "\n";
      ++failures;
      continue;
    }
    std::cout << "answer shape [" << absl::StrJoin(answer.output.sizes(), ", ") << "] sum "
              << answer.output.sum().item<double>();
    if (!answer.trace_file.empty()) {
      std::cout << "; captured " << answer.captured_ops << " ops -> " << answer.trace_file << ", "
                << answer.graph_file;
    }
    if (!answer.status.ok()) std::cout << "; capture: " << answer.status.message();
    std::cout << "\n";
  }
  return failures == 0 ? 0 : 1;
}
