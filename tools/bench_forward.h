// The bench's forward rows: what capture, validation and interventions cost one model, as
// ratios to its plain forward pass measured in the same run.
#ifndef TORCHLENS_TOOLS_BENCH_FORWARD_H_
#define TORCHLENS_TOOLS_BENCH_FORWARD_H_

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tools/bench_models.h"

namespace torchlens {

// Rows for `model` (its file in `models_dir`), the configurations its Rows give run
// interleaved after warm-up, medians over `repeats` rounds (0: as many as fit in a few
// seconds):
//   plain                   model.forward: the reference
//   capture_unsaved(_graph) TraceModule without saved values (and reading its graph)
//   private_plan            the private plan captures run (NOTE [Stable plans])
//   keep_outputs/values     that plan keeping every output or value (output_keeper.h)
//   capture(_graph)         TraceModule (and reading its graph)
//   capture_to_disk         TraceModule with CaptureOptions::trace_file; write_loop the
//                           same bytes written by a plain loop
//   capture_layer4          saving one module's values; halt_layer1.0 an early stop
//   validate(_2_threads)    ValidateForwardPass; validate_floor the kernel calls it makes
//   do_last_op, do_first_op Do on the last and first op
// with peak memory and saved bytes on the capture rows. `configs`, when not empty, keeps
// those rows and plain. Null when the model cannot be captured.
nlohmann::json BenchForward(const BenchModel& model, const std::string& models_dir, int repeats,
                            const std::vector<std::string>& configs);

}  // namespace torchlens

#endif  // TORCHLENS_TOOLS_BENCH_FORWARD_H_
