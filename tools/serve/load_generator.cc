// Load on the example service with sampled capture: N client threads send a fixed number
// of requests each, one after the other, at three sampling rates (capture off, 1 in 100,
// 1 in 10); the latency of the requests that were not captured is reported as p50, p99 and
// p999. The rates take turns round by round, so that the machine's drift moves all alike.
//
//   tools/bazelw run -c opt //tools/serve:load_generator -- --clients 2 --requests 3000
//
// Flags: --model FILE.pt (default testdata/demo.pt), --input_shape (default 1,3,16,16),
// --clients N, --requests N (per rate and round, over all clients), --rounds N,
// --intra_op_threads N (default 1: each request on its own thread),
// --max_trace_bytes N, --out_dir DIR (traces, at most 8 kept).
#include <sys/stat.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tools/cli_flags.h"
#include "tools/flag_parser.h"
#include "tools/serve/service.h"
#include "torchlens_dispatch/load_model.h"
#include "torchlens_dispatch/script_errors.h"

namespace {

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t index = std::min(values.size() - 1, static_cast<size_t>(p * values.size()));
  return values[index];
}

int Fail(const std::string& message) {
  std::cerr << "load_generator: error: " << message << "\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path = "testdata/demo.pt";
  std::string input_shape = "1,3,16,16";
  std::string out_dir = "/tmp/torchlens-load";
  int clients = 2;
  int requests = 2000;
  int rounds = 3;
  int64_t max_trace_bytes = -1;
  int intra_op_threads = 1;
  torchlens::FlagParser flags;
  flags.String("model", &model_path);
  flags.String("input_shape", &input_shape);
  flags.String("out_dir", &out_dir);
  flags.Int("clients", &clients, 1);
  flags.Int("requests", &requests, 1);
  flags.Int("rounds", &rounds, 1);
  flags.Int("max_trace_bytes", &max_trace_bytes, 0);
  flags.Int("intra_op_threads", &intra_op_threads, 1);
  if (absl::Status parsed = flags.Parse(argc, argv); !parsed.ok()) {
    return Fail(std::string(parsed.message()));
  }
  absl::StatusOr<torch::jit::Module> model =
      torchlens::LoadTorchScript(torchlens::UserPath(model_path));
  if (!model.ok()) return Fail(std::string(model.status().message()));
  model->eval();
  at::set_num_threads(intra_op_threads);  // per request, as a service sets it
  absl::StatusOr<std::vector<std::vector<int64_t>>> shapes =
      torchlens::ParseInputShapes(input_shape);
  if (!shapes.ok() || shapes->size() != 1) return Fail("--input_shape: one shape");
  out_dir = torchlens::UserPath(out_dir);
  ::mkdir(out_dir.c_str(), 0755);
  torch::manual_seed(0);
  const at::Tensor input = torch::randn(shapes->front());
  try {
    // Every request would fail the same way, and be counted, not timed, minutes on end.
    torch::NoGradGuard no_grad;
    model->forward({input});
  } catch (const std::exception& e) {
    return Fail(absl::StrCat("the model fails on an input of shape ", input_shape, ": ",
                             torchlens::ParseInterpreterError(e.what()).OneLine(),
                             "; give the shape it takes with --input_shape"));
  }

  struct Rate {
    const char* name;
    int one_in;
    std::vector<double> micros;  // uncaptured requests
    int captured = 0;
    int partial = 0;
    int failed = 0;  // requests whose capture (or forward) failed: not timed
  };
  std::vector<Rate> rates = {{"off", 0}, {"1%", 100}, {"10%", 10}};
  for (int round = -1; round < rounds; ++round) {  // round -1 warms up
    for (Rate& rate : rates) {
      torchlens::serve::ServiceOptions options;
      options.out_dir = out_dir;
      options.capture_one_in = rate.one_in;
      options.max_traces_kept = 8;
      options.max_trace_bytes = max_trace_bytes;
      options.render_graphs = false;
      torchlens::serve::Service service(*model, options);
      std::vector<std::vector<double>> latencies(clients);
      std::vector<int> captured(clients, 0), partial(clients, 0), failed(clients, 0);
      std::vector<std::thread> threads;
      for (int c = 0; c < clients; ++c) {
        threads.emplace_back([&, c] {
          for (int i = c; i < requests; i += clients) {
            const auto start = std::chrono::steady_clock::now();
            const torchlens::serve::Answer answer = service.Handle({i, input, false});
            const double us =
                std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
                    .count();
            if (!answer.status.ok()) {
              ++failed[c];
            } else if (answer.trace_file.empty()) {
              latencies[c].push_back(us);
            } else {
              ++captured[c];
              partial[c] += answer.partial ? 1 : 0;
            }
          }
        });
      }
      for (std::thread& thread : threads) thread.join();
      if (absl::Status written = service.Flush(); !written.ok()) {
        return Fail(std::string(written.message()));
      }
      if (round < 0) continue;
      for (int c = 0; c < clients; ++c) {
        rate.micros.insert(rate.micros.end(), latencies[c].begin(), latencies[c].end());
        rate.captured += captured[c];
        rate.partial += partial[c];
        rate.failed += failed[c];
      }
    }
  }
  const double off_p99 = Percentile(rates[0].micros, 0.99);
  std::cout << absl::StrFormat("%d clients, %d requests per rate and round, %d rounds, model %s\n",
                               clients, requests, rounds, model_path);
  std::cout << absl::StrFormat("%-8s %10s %10s %10s %10s %10s %9s %7s\n", "capture", "uncaptured",
                               "p50 us", "p99 us", "p999 us", "p99/off", "captured", "failed");
  for (const Rate& rate : rates) {
    const double p99 = Percentile(rate.micros, 0.99);
    std::cout << absl::StrFormat("%-8s %10zu %10.1f %10.1f %10.1f %9.3fx %9d %7d\n", rate.name,
                                 rate.micros.size(), Percentile(rate.micros, 0.5), p99,
                                 Percentile(rate.micros, 0.999), p99 / off_p99, rate.captured,
                                 rate.failed);
  }
  return 0;
}
