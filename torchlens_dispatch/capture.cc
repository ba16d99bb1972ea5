#include "torchlens_dispatch/capture.h"

#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/nn/module.h>
#include <torch/script.h>

#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "graph/build_trace.h"
#include "graph/trace_file_writer.h"
#include "torchlens_dispatch/fallback.h"
#include "torchlens_dispatch/gradient_hooks.h"
#include "torchlens_dispatch/model_layout.h"
#include "torchlens_dispatch/ops/capture_key.h"
#include "torchlens_dispatch/ops/exception_text.h"
#include "torchlens_dispatch/recorder.h"
#include "torchlens_dispatch/script_errors.h"
#include "torchlens_dispatch/script_runner.h"

namespace torchlens {

namespace {

// The parameters of a model of each kind, as an iterable of tensors.
template <typename Model>
auto ParametersOf(const Model& model) {
  return model.parameters();
}
std::vector<at::Tensor> ParametersOf(const EagerModel& model) {
  std::vector<at::Tensor> parameters;
  for (const EagerModel::Tensor& param : model.params) parameters.push_back(param.tensor);
  return parameters;
}

// CaptureOptions::trace_file, when set: a writer for the file, fed by a value sink, with
// the capture keeping no value (NOTE [Streaming without saving]); the model's parameters
// are queued for its writer thread. `Model` is torch::jit::Module or torch::nn::Module.
template <typename Model>
absl::Status StreamToFile(const Model& model, CaptureOptions* options,
                          std::unique_ptr<TraceFileWriter>* writer) {
  if (options->trace_file.empty()) return absl::OkStatus();
  if (!options->save_activations || options->value_sink || !options->save_modules.empty() ||
      !options->save_types.empty() || !options->save_labels.empty() || options->save_if ||
      options->max_saved_bytes >= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CaptureOptions::trace_file (\"", options->trace_file,
        "\") writes every value to the file as it is captured: it needs save_activations = "
        "true, no value_sink of your own (the file is the sink), and no selective saving or "
        "max_saved_bytes (memory stays bounded without them)"));
  }
  absl::StatusOr<std::unique_ptr<TraceFileWriter>> created =
      TraceFileWriter::Create(options->trace_file);
  if (!created.ok()) return created.status();
  *writer = *std::move(created);
  TraceFileWriter* file = writer->get();
  options->save_activations = false;
  options->value_sink = [file](const StreamedValue& value) {
    const absl::Status added = file->AddValue(value.node, value.output, value.value);
    if (!added.ok()) throw std::runtime_error(std::string(added.message()));
  };
  for (const at::Tensor& parameter : ParametersOf(model)) file->AddParameter(parameter);
  return absl::OkStatus();
}

}  // namespace

// Thread state switched for the guard's lifetime, restored in reverse order.
struct CaptureGuard::State {
  State(std::shared_ptr<const ModelLayout> layout, bool training, CaptureOptions options,
        std::unique_ptr<TraceFileWriter> file)
      : file(std::move(file)),
        gradients(options.save_grads ? std::make_unique<GradientHooks>(*layout) : nullptr),
        recorder(std::move(layout), training, options) {
    if (gradients != nullptr) recorder.SetGradientHooks(gradients.get());
    if (this->file != nullptr) {
      // See NOTE [Parameters written through views] in parameter_state.h.
      recorder.SetBeforeParameterWrite([writer = this->file.get()](const at::Tensor& parameter) {
        writer->KeepParameterBeforeWrite(parameter);
      });
    }
    Recorder::SetCurrent(&recorder);
    include_key.emplace(kCaptureKey);
    unoptimized.emplace(false);
  }
  ~State() { End(); }
  void End() {
    unoptimized.reset();
    include_key.reset();
    if (Recorder::Current() == &recorder) Recorder::SetCurrent(nullptr);
  }

  std::unique_ptr<TraceFileWriter> file;     // CaptureOptions::trace_file; outlives the sink
  std::unique_ptr<GradientHooks> gradients;  // CaptureOptions::save_grads
  Recorder recorder;
  std::optional<c10::impl::IncludeDispatchKeyGuard> include_key;
  // See capture.h: one execution plan for every capture of a TorchScript model.
  std::optional<torch::jit::GraphOptimizerEnabledGuard> unoptimized;
};

CaptureGuard::CaptureGuard(torch::jit::Module& model, CaptureOptions options) {
  if (Recorder::Current() == nullptr) {
    std::shared_ptr<const ModelLayout> layout = LayoutOf(model);
    if (!layout->forked_work.empty()) {  // NOTE [Forked work]
      refusal_ = absl::UnimplementedError(absl::StrCat(
          "this model runs work on other threads (", layout->forked_work,
          "): torchlens captures the thread that runs the forward, so the forked ops would be "
          "missing from the trace. Capture a version of the model that calls the function "
          "instead of forking it"));
      return;
    }
    std::unique_ptr<TraceFileWriter> file;
    refusal_ = StreamToFile(model, &options, &file);
    if (!refusal_.ok()) return;
    CaptureFallbackRegistered();
    state_ = std::make_unique<State>(std::move(layout), model.is_training(), std::move(options),
                                     std::move(file));
  }
}

CaptureGuard::CaptureGuard(torch::nn::Module& model, CaptureOptions options) {
  if (Recorder::Current() == nullptr) {
    std::unique_ptr<TraceFileWriter> file;
    refusal_ = StreamToFile(model, &options, &file);
    if (!refusal_.ok()) return;
    CaptureFallbackRegistered();
    state_ = std::make_unique<State>(LayoutOf(model), model.is_training(), std::move(options),
                                     std::move(file));
  }
}

CaptureGuard::CaptureGuard(const EagerModel& model, CaptureOptions options) {
  if (Recorder::Current() == nullptr) {
    std::unique_ptr<TraceFileWriter> file;
    refusal_ = StreamToFile(model, &options, &file);
    if (!refusal_.ok()) return;
    CaptureFallbackRegistered();
    state_ = std::make_unique<State>(model.layout != nullptr ? model.layout : LayoutOf(model),
                                     model.training, std::move(options), std::move(file));
  }
}

CaptureGuard::~CaptureGuard() = default;

void CaptureGuard::Stop() {
  if (state_ != nullptr) state_->End();
}

bool CaptureGuard::active() const { return state_ != nullptr && !finished_; }

void CaptureGuard::MarkInputs(const c10::IValue& inputs) {
  if (active()) state_->recorder.MarkInputs(inputs);
}

absl::StatusOr<Trace> CaptureGuard::Finish(const c10::IValue& outputs) {
  return End(outputs, std::nullopt);
}

absl::StatusOr<Trace> CaptureGuard::FinishAfterForwardError(std::string reason) {
  return End(c10::IValue(), std::move(reason));
}

absl::StatusOr<Trace> CaptureGuard::End(const c10::IValue& outputs,
                                        std::optional<std::string> forward_error) {
  if (!refusal_.ok()) return refusal_;
  if (state_ == nullptr) {
    return absl::FailedPreconditionError(
        "this CaptureGuard is inert: another CaptureGuard was already capturing on this "
        "thread when it was created (guards do not nest; the outer capture continues). "
        "Finish the outer guard first, or capture on another thread");
  }
  if (finished_) {
    return absl::FailedPreconditionError(
        "CaptureGuard::Finish was already called; a guard captures one trace. Create a new "
        "CaptureGuard to capture again");
  }
  finished_ = true;
  absl::StatusOr<CaptureRecord> record =
      forward_error.has_value()
          ? state_->recorder.FinishAfterForwardError(*std::move(forward_error))
          : state_->recorder.Finish(outputs);
  state_->End();
  if (!record.ok()) return record.status();
  // NOTE [Gradients in a trace] in graph/gradients.h.
  if (state_->gradients != nullptr) record->gradients = state_->gradients->Finish(*record);
  const bool over_budget = record->budget_exceeded;
  const std::string sink_failure = record->sink_failure;
  const int32_t sink_failed_node = record->sink_failed_node;
  Trace trace = BuildTrace(*std::move(record));
  if (sink_failed_node >= 0) {  // NOTE [Streaming saved values]
    const std::string label = static_cast<size_t>(sink_failed_node) < trace.ops().size()
                                  ? trace.ops()[sink_failed_node].label
                                  : absl::StrCat("node ", sink_failed_node);
    if (state_->file != nullptr) {
      return absl::AbortedError(absl::StrCat(
          "writing the trace file stopped at the value of ", label, ": ", sink_failure,
          "; the forward ran to its end undisturbed and the partial file was removed"));
    }
    return absl::AbortedError(
        absl::StrCat("CaptureOptions::value_sink threw on the value of ", label, ": ", sink_failure,
                     "; it was not called again, and the forward ran to its end undisturbed"));
  }
  if (over_budget && !state_->recorder.options().partial_on_budget) {
    return absl::ResourceExhaustedError(absl::StrCat(
        trace.partial_reason(),
        ". Raise CaptureOptions::max_saved_bytes, save fewer ops (save_modules, save_types, "
        "save_labels, save_if), or set partial_on_budget to get this partial trace"));
  }
  if (state_->file != nullptr) return state_->file->Finish(trace);
  return trace;
}

bool CaptureGuard::halted() const { return state_ != nullptr && state_->recorder.halted(); }

absl::StatusOr<Trace> TraceModule(torch::jit::Module& model, std::vector<c10::IValue> inputs,
                                  CaptureOptions options) {
  return TraceModule(model, std::move(inputs), std::move(options), nullptr);
}

absl::StatusOr<Trace> TraceModule(torch::jit::Module& model, std::vector<c10::IValue> inputs,
                                  CaptureOptions options, c10::IValue* outputs) {
  CaptureGuard guard(model, options);
  if (!guard.active()) return guard.Finish(c10::IValue());
  guard.MarkInputs(c10::ivalue::Tuple::create(inputs));
  c10::IValue returned;
  try {
    returned = RunUnoptimized(model, std::move(inputs));  // NOTE [Stable plans]
  } catch (const std::exception& e) {
    // CaptureOptions::halt_after stopped the forward: the trace so far.
    if (guard.halted()) return guard.Finish(c10::IValue());
    const ScriptError error = ParseInterpreterError(MessageOf(e));
    const bool out_of_memory = IsOutOfMemory(e);
    return absl::Status(
        out_of_memory ? absl::StatusCode::kResourceExhausted : absl::StatusCode::kInvalidArgument,
        absl::StrCat("the model's forward failed on these inputs: ", error.OneLine()));
  }
  absl::StatusOr<Trace> trace = guard.Finish(returned);
  if (trace.ok() && outputs != nullptr) *outputs = std::move(returned);
  return trace;
}

}  // namespace torchlens
