#include "validation/replay.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "graph/fused_mutators.h"
#include "graph/ivalue_tensors.h"
#include "torchlens_dispatch/capture_key.h"

namespace torchlens {
namespace {

absl::StatusOr<c10::OperatorHandle> Handle(const Op& op) {
  c10::optional<c10::OperatorHandle> handle =
      c10::Dispatcher::singleton().findSchema({op.func_name, op.overload_name});
  if (!handle.has_value()) {
    return absl::NotFoundError(absl::StrCat(
        "not replayable: operator ", op.func_name, op.overload_name.empty() ? "" : ".",
        op.overload_name, " is not registered in this process (load the library that defines it)"));
  }
  return *handle;
}

bool TakesGenerator(const c10::FunctionSchema& schema) {
  for (const c10::Argument& argument : schema.arguments()) {
    const c10::TypePtr& type = argument.type();
    if (type->kind() == c10::TypeKind::GeneratorType) return true;
    if (type->kind() == c10::TypeKind::OptionalType &&
        type->expectRef<c10::OptionalType>().getElementType()->kind() ==
            c10::TypeKind::GeneratorType) {
      return true;
    }
  }
  return false;
}

bool ConsumesRandomness(const c10::OperatorHandle& handle) {
  return handle.hasTag(at::Tag::nondeterministic_seeded) || TakesGenerator(handle.schema());
}

std::string FirstLine(const std::string& text) { return text.substr(0, text.find('\n')); }

// Swaps the default CPU generator's state for the op's captured one and back. The
// generator's mutex is not held during the op, which locks it itself.
class CapturedRandomness {
 public:
  explicit CapturedRandomness(const at::Tensor& state)
      : generator_(at::detail::getDefaultCPUGenerator()) {
    std::lock_guard<std::mutex> lock(generator_.mutex());
    saved_ = generator_.get_state();
    generator_.set_state(state);
  }
  ~CapturedRandomness() {
    std::lock_guard<std::mutex> lock(generator_.mutex());
    generator_.set_state(saved_);
  }
  CapturedRandomness(const CapturedRandomness&) = delete;
  CapturedRandomness& operator=(const CapturedRandomness&) = delete;

 private:
  at::Generator generator_;
  at::Tensor saved_;
};

}  // namespace

bool ConsumesRandomness(const Op& op) {
  absl::StatusOr<c10::OperatorHandle> handle = Handle(op);
  return handle.ok() && ConsumesRandomness(*handle);
}

std::vector<c10::IValue> ReplayArguments(const Op& op, const ArgumentValue& value) {
  std::vector<c10::IValue> args;
  args.reserve(op.creation_args.size());
  int index = 0;
  static const ArgSource kUnknown;
  for (const c10::IValue& arg : op.creation_args) {
    args.push_back(MapTensors(arg, [&](const at::Tensor& saved) {
      const ArgSource& source =
          index < static_cast<int>(op.arg_sources.size()) ? op.arg_sources[index] : kUnknown;
      return value(index++, source, saved);
    }));
  }
  return args;
}

absl::StatusOr<ReplayResult> ReplayOp(const Op& op, std::vector<c10::IValue> args) {
  absl::StatusOr<c10::OperatorHandle> handle = Handle(op);
  if (!handle.ok()) return handle.status();
  const c10::FunctionSchema& schema = handle->schema();
  if (args.size() != schema.arguments().size()) {
    return absl::FailedPreconditionError(
        absl::StrCat("not replayable: ", op.label, " has ", args.size(), " saved arguments, ",
                     op.func_name, " takes ", schema.arguments().size(),
                     " (capture with CaptureOptions::save_activations = true)"));
  }

  // NOTE [Replay never writes captured data]
  const FusedMutator* fused = FindFusedMutator(op.func_name);
  const bool updating = fused != nullptr && UpdatesState(*fused, args);
  ReplayResult result;
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::AliasInfo* alias = schema.arguments()[i].alias_info();
    const bool state = updating && IsStateArgument(*fused, static_cast<int>(i));
    if ((alias != nullptr && alias->isWrite()) || state) {
      args[i] = MapTensors(
          args[i], [](const at::Tensor& t) { return t.defined() ? t.detach().clone() : t; });
      if (state && args[i].isTensor()) {
        result.state_after.emplace_back(static_cast<int>(i), args[i].toTensor());
      }
    }
  }

  std::optional<CapturedRandomness> randomness;
  if (ConsumesRandomness(*handle)) {
    if (!op.rng_state.defined()) {
      return absl::FailedPreconditionError(
          absl::StrCat("not replayable: ", op.func_name,
                       " consumes randomness and the trace holds no generator state for it"));
    }
    randomness.emplace(op.rng_state);
  }

  c10::impl::ExcludeDispatchKeyGuard not_captured(kCaptureKey);
  torch::jit::Stack stack(std::move(args));
  try {
    handle->callBoxed(stack);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("not replayable: ", op.func_name,
                                            " threw: ", FirstLine(e.what_without_backtrace())));
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("not replayable: ", op.func_name, " threw: ", FirstLine(e.what())));
  }
  for (const c10::IValue& value : stack) {
    ForEachTensor(value, [&](const at::Tensor& t) { result.outputs.push_back(t); });
  }
  result.returns = std::move(stack);
  return result;
}

}  // namespace torchlens
