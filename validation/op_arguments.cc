#include "validation/op_arguments.h"

#include <array>
#include <string>

#include "absl/strings/str_cat.h"
#include "torchlens_dispatch/ops/ivalue_tensors.h"
#include "torchlens_dispatch/ops/randomness.h"

namespace torchlens {
namespace {

// Validation replays each op several times (once, then per perturbation), and finding an
// operator hashes its name: a small per-thread cache by node remembers the last handles.
// An entry is used only for a node with the same operator name, so a node at the address
// of a destroyed one is looked up again.
struct CachedHandle {
  const Op* op = nullptr;
  std::string name;
  std::string overload;
  c10::optional<c10::OperatorHandle> handle;
};

}  // namespace

absl::StatusOr<c10::OperatorHandle> OperatorOf(const Op& op) {
  constexpr size_t kEntries = 64;
  thread_local std::array<CachedHandle, kEntries> cache;
  CachedHandle& cached = cache[(reinterpret_cast<uintptr_t>(&op) / sizeof(Op)) % kEntries];
  if (cached.op == &op && cached.handle.has_value() && cached.name == op.func_name &&
      cached.overload == op.overload_name) {
    return *cached.handle;
  }
  c10::optional<c10::OperatorHandle> handle =
      c10::Dispatcher::singleton().findSchema({op.func_name, op.overload_name});
  if (handle.has_value()) cached = CachedHandle{&op, op.func_name, op.overload_name, handle};
  if (!handle.has_value()) {
    return absl::NotFoundError(absl::StrCat(
        "not replayable: operator ", op.func_name, op.overload_name.empty() ? "" : ".",
        op.overload_name, " is not registered in this process (load the library that defines it)"));
  }
  return *handle;
}

void VisitValuesReplayReads(const std::vector<Op>& ops, size_t i,
                            const std::function<void(const at::Tensor&)>& visit) {
  auto visit_values = [&](const Op& op) {
    visit(op.out);
    for (const at::Tensor& t : op.outs) visit(t);
    for (const AliasWrite& write : op.alias_writes) visit(write.value);
  };
  const Op& op = ops[i];
  visit_values(op);
  for (const c10::IValue& arg : op.creation_args) ForEachTensor(arg, visit);
  for (int32_t parent : op.parent_indices) {
    if (parent >= 0 && static_cast<size_t>(parent) < ops.size()) visit_values(ops[parent]);
  }
}

bool ConsumesRandomness(const Op& op) {
  absl::StatusOr<c10::OperatorHandle> handle = OperatorOf(op);
  return handle.ok() && ConsumesRandomness(*handle);
}

std::vector<c10::IValue> ReplayArguments(const Op& op, ArgumentValue value) {
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

std::vector<c10::IValue> CapturedArguments(const Op& op) {
  return ReplayArguments(op, [](int, const ArgSource&, const at::Tensor& saved) { return saved; });
}

absl::Status RequireSavedValues(const Trace& trace, absl::string_view purpose) {
  if (trace.has_saved_values()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("the trace holds no saved values, so there is nothing to replay: capture with "
                   "CaptureOptions::save_activations = true (the default) to ",
                   purpose));
}

std::vector<int> FirstTensorOfArguments(const Op& op) {
  std::vector<int> first(op.creation_args.size(), -1);
  int index = 0;
  for (size_t a = 0; a < op.creation_args.size(); ++a) {
    ForEachTensor(op.creation_args[a], [&](const at::Tensor&) {
      if (first[a] < 0) first[a] = index;
      ++index;
    });
  }
  return first;
}

bool ArgumentsNotKept(const Op& op) {
  // See NOTE [Arguments a trace file cannot hold].
  if (!op.is_compute() || !op.creation_args.empty() || !op.saved()) return false;
  absl::StatusOr<c10::OperatorHandle> handle = OperatorOf(op);
  return handle.ok() && !handle->schema().arguments().empty();
}

std::vector<int> OutTensors(const Op& op) {
  std::vector<int> out;
  absl::StatusOr<c10::OperatorHandle> handle = OperatorOf(op);
  if (!handle.ok()) return out;
  const std::vector<c10::Argument>& arguments = handle->schema().arguments();
  int index = 0;
  for (size_t a = 0; a < op.creation_args.size(); ++a) {
    const bool is_out = a < arguments.size() && arguments[a].is_out();
    ForEachTensor(op.creation_args[a], [&](const at::Tensor&) {
      if (is_out) out.push_back(index);
      ++index;
    });
  }
  return out;
}

FusedStateVersions FindFusedStateVersions(const Op& op, int argument,
                                          const std::vector<Op>& nodes) {
  FusedStateVersions versions;
  const std::vector<int> first = FirstTensorOfArguments(op);
  const int tensor_index =
      argument >= 0 && argument < static_cast<int>(first.size()) ? first[argument] : -1;
  if (tensor_index < 0 || tensor_index >= static_cast<int>(op.arg_sources.size())) return versions;
  const Op* previous = SourceNode(nodes, op.arg_sources[tensor_index]);
  if (previous == nullptr || !previous->is_buffer_version()) return versions;
  versions.previous = previous;
  for (int32_t child : op.child_indices) {
    const Op* candidate =
        child >= 0 && static_cast<size_t>(child) < nodes.size() ? &nodes[child] : nullptr;
    if (candidate != nullptr && candidate->is_buffer_version() &&
        candidate->address == previous->address &&
        candidate->buffer_write_kind == WriteKind::kFused) {
      versions.written = candidate;
    }
  }
  return versions;
}

at::Tensor TensorArgument(const std::vector<c10::IValue>& args, int index) {
  at::Tensor found;
  int i = 0;
  for (const c10::IValue& arg : args) {
    ForEachTensor(arg, [&](const at::Tensor& t) {
      if (i++ == index) found = t;
    });
  }
  return found;
}

const ArgSource* ViewedSource(const Op& op, int output) {
  if (!op.is_compute() || output < 0) return nullptr;
  absl::StatusOr<c10::OperatorHandle> handle = OperatorOf(op);
  if (!handle.ok()) return nullptr;
  const c10::FunctionSchema& schema = handle->schema();
  if (output >= static_cast<int>(schema.returns().size())) return nullptr;
  for (int r = 0; r <= output; ++r) {
    if (schema.returns()[r].type()->kind() != c10::TypeKind::TensorType) return nullptr;
  }
  const c10::AliasInfo* returned = schema.returns()[output].alias_info();
  if (returned == nullptr || returned->isWrite()) return nullptr;
  const std::vector<int> first = FirstTensorOfArguments(op);
  for (size_t a = 0; a < schema.arguments().size() && a < first.size(); ++a) {
    const c10::AliasInfo* alias = schema.arguments()[a].alias_info();
    if (alias == nullptr || alias->isWrite() || alias->beforeSets() != returned->beforeSets() ||
        first[a] < 0 || first[a] >= static_cast<int>(op.arg_sources.size())) {
      continue;
    }
    const ArgSource& source = op.arg_sources[first[a]];
    return source.kind == ArgSource::Kind::kNode ? &source : nullptr;
  }
  return nullptr;
}

}  // namespace torchlens
