#include "validation/replay.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/core/Generator.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "graph/label.h"
#include "torchlens_dispatch/ops/capture_key.h"
#include "torchlens_dispatch/ops/exception_text.h"
#include "torchlens_dispatch/ops/fused_mutators.h"
#include "torchlens_dispatch/ops/inplace_view.h"
#include "torchlens_dispatch/ops/ivalue_tensors.h"
#include "torchlens_dispatch/ops/randomness.h"
#include "torchlens_dispatch/ops/saved_copy.h"
#include "torchlens_dispatch/ops/storage_ranges.h"
#include "validation/kernel_preconditions.h"

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

absl::StatusOr<c10::OperatorHandle> Handle(const Op& op) {
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

// Swaps the default CPU generator's state for the op's captured one and back. The
// generator's mutex is not held during the op, which locks it itself.
// One replay of a random op at a time: the state swapped in must be the one its kernel
// draws from, also when several threads replay (NOTE [Validating on several threads]).
std::mutex& RandomReplays() {
  static std::mutex* const mutex = new std::mutex();
  return *mutex;
}

class CapturedRandomness {
 public:
  explicit CapturedRandomness(const at::Tensor& state)
      : one_at_a_time_(RandomReplays()), generator_(at::detail::getDefaultCPUGenerator()) {
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
  std::lock_guard<std::mutex> one_at_a_time_;
  at::Generator generator_;
  at::Tensor saved_;
};

}  // namespace

bool ConsumesRandomness(const Op& op) {
  absl::StatusOr<c10::OperatorHandle> handle = Handle(op);
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
  absl::StatusOr<c10::OperatorHandle> handle = Handle(op);
  return handle.ok() && !handle->schema().arguments().empty();
}

std::vector<int> OutTensors(const Op& op) {
  std::vector<int> out;
  absl::StatusOr<c10::OperatorHandle> handle = Handle(op);
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
                                          const std::function<const Op*(absl::string_view)>& node) {
  FusedStateVersions versions;
  const std::vector<int> first = FirstTensorOfArguments(op);
  const int tensor_index =
      argument >= 0 && argument < static_cast<int>(first.size()) ? first[argument] : -1;
  if (tensor_index < 0 || tensor_index >= static_cast<int>(op.arg_sources.size())) return versions;
  const Op* previous = node(op.arg_sources[tensor_index].name);
  if (previous == nullptr || !previous->is_buffer) return versions;
  versions.previous = previous;
  for (const std::string& child : op.children) {
    const Op* candidate = node(child);
    if (candidate != nullptr && candidate->is_buffer && candidate->address == previous->address &&
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

namespace {

// The most bytes the layout of a write through an alias may take beyond its two values'
// own: a captured write's two geometries are views of one storage, whose span is the
// values' bytes unless the views have gaps (a column of a matrix spans the matrix). A
// crafted file's may span anything, and the layout is zero-filled memory.
constexpr int64_t kMaxAliasLayoutBytes = int64_t{256} << 20;

// NOTE [Writes through views of another dtype]
// `z.real`, `z[1].imag` and `torch.view_as_real(z)` are real views of a complex tensor,
// `torch.view_as_complex(f)` a complex view of a real one, `x.view(torch.int32)` an
// integer view of a float one: the write and the tensor it changes count their
// geometries in elements of their own dtypes. ReplayAliasWrite lays their region out in
// bytes, from a byte both dtypes' elements start on, and makes each one's place of it
// through a view in its own dtype, so that every element keeps its bit pattern.

bool Fits(const TensorGeometry& geometry, const at::Tensor& value) {
  return value.defined() && geometry.sizes.size() == geometry.strides.size() &&
         value.sizes() == c10::IntArrayRef(geometry.sizes) && value.layout() == at::kStrided &&
         !value.is_quantized();
}

// Whether nothing but the call's arguments holds `t` or its memory: a perturbation made
// for this replay, never a saved value (the trace holds those). Writing it in place writes
// no captured data, so it needs no clone (NOTE [Replay never writes captured data]).
// MapTensors hands the callback the argument list's own reference, so a tensor nothing
// else holds has a count of one; a saved value is also held by its trace.
bool OwnedByTheCall(const at::Tensor& t) {
  return t.use_count() == 1 && t.storage().use_count() == 1 && !t.is_view();
}

// `value` as a list of the element type argument `argument` declares, when a trace file
// typed it otherwise: the file stores `aten::index`'s `Tensor?[]` indices as a list of
// tensors when none is None, and an empty list (`x.sum(dim=[])`, `new_zeros([])`) with no
// element type at all. The dispatcher retypes a narrower list only when nothing else holds
// it (an intervention's fork also keeps its arguments) and an empty one never.
c10::IValue WithDeclaredListType(const c10::Argument& argument, c10::IValue value) {
  if (!value.isList()) return value;
  c10::TypePtr declared = argument.type();
  if (declared->kind() == c10::TypeKind::OptionalType) {
    declared = declared->expectRef<c10::OptionalType>().getElementType();
  }
  if (declared->kind() != c10::TypeKind::ListType) return value;
  c10::TypePtr element = declared->expectRef<c10::ListType>().getElementType();
  // TorchScript passes a SymInt[] (sizes) as a list of ints.
  if (element->kind() == c10::TypeKind::SymIntType) element = c10::IntType::get();
  c10::List<c10::IValue> list = value.toList();
  if (*list.elementType() == *element ||
      (!list.empty() && !list.elementType()->isSubtypeOf(*element))) {
    return value;
  }
  c10::impl::GenericList retyped(element);
  retyped.reserve(list.size());
  for (const c10::IValue& item : value.toListRef()) retyped.push_back(item);
  return c10::IValue(std::move(retyped));
}

// NOTE [Written arguments outlive the boxed call]
// LibTorch 1.13's boxed wrapper of an unboxed kernel (make_boxed_from_unboxed_functor.h)
// drops the arguments off the stack before it pushes the returns. A returned `Tensor&` is
// first copied into an owning `Tensor`, but a returned `std::tuple<Tensor&, Tensor&>`
// (`max.dim_max`, `sort.values`, `topk.values`, ...) stays a tuple of references. When
// the stack held the only reference to a written argument, as it does for the clones made
// here, those references name freed tensors. Holding one more reference to every written
// argument for the duration of the call keeps the returns alive. Callers whose arguments
// are owned elsewhere (the model's buffers, the interpreter's registers) never hit this.

// Runs the op on clones of the tensors it writes, except the tensor numbered
// those numbered `private_tensors` (in ForEachTensor order over `args`), which the caller made
// for this call.
absl::StatusOr<ReplayResult> Run(const Op& op, std::vector<c10::IValue> args,
                                 absl::Span<const int> private_tensors = {}) {
  absl::StatusOr<c10::OperatorHandle> handle = Handle(op);
  if (!handle.ok()) return handle.status();
  const c10::FunctionSchema& schema = handle->schema();
  if (ArgumentsNotKept(op)) {
    // See NOTE [Arguments a trace file cannot hold].
    return absl::FailedPreconditionError(absl::StrCat(
        "not replayable: the trace holds the outputs of ", op.label, " (", op.func_name,
        ") but not its arguments: a trace file keeps no argument list it cannot pickle "
        "(quantized packed parameters, other TorchBind objects). Replay it from the capture "
        "itself, not from a trace file"));
  }
  if (args.size() != schema.arguments().size()) {
    return absl::FailedPreconditionError(
        absl::StrCat("not replayable: ", op.label, " has ", args.size(), " saved arguments, ",
                     op.func_name, " takes ", schema.arguments().size(),
                     " (capture with CaptureOptions::save_activations = true)"));
  }
  // See NOTE [Kernels that trust their arguments].
  if (absl::Status safe = CheckKernelPreconditions(schema.operator_name(), args); !safe.ok()) {
    return MarkKernelPreconditionRefusal(absl::FailedPreconditionError(
        absl::StrCat("not replayable: ", op.label, " calls ", safe.message())));
  }

  // See NOTE [Replay never writes captured data].
  const FusedMutator* fused = FindFusedMutator(op.func_name);
  const bool updating = fused != nullptr && UpdatesState(*fused, args);
  ReplayResult result;
  std::vector<c10::IValue> written_arguments;  // NOTE [Written arguments outlive the boxed call]
  int tensor_index = 0;
  for (size_t i = 0; i < args.size(); ++i) {
    args[i] = WithDeclaredListType(schema.arguments()[i], std::move(args[i]));
    const c10::AliasInfo* alias = schema.arguments()[i].alias_info();
    const bool written = alias != nullptr && alias->isWrite();
    const bool state = updating && IsStateArgument(*fused, static_cast<int>(i));
    if (!written && !state) {
      ForEachTensor(args[i], [&](const at::Tensor&) { ++tensor_index; });
      continue;
    }
    args[i] = MapTensors(args[i], [&](const at::Tensor& t) {
      const int index = tensor_index++;
      const bool made_for_the_call = std::find(private_tensors.begin(), private_tensors.end(),
                                               index) != private_tensors.end() ||
                                     OwnedByTheCall(t);
      // See NOTE [Saved copies keep their strides]: a kernel may take another path for
      // a dense clone of a strided state argument (batch norm does).
      return !t.defined() || made_for_the_call ? t : StridedCopy(t.detach());
    });
    if (state && args[i].isTensor()) {
      result.state_after.emplace_back(static_cast<int>(i), args[i].toTensor());
    }
    if (written) written_arguments.push_back(args[i]);
  }

  std::optional<CapturedRandomness> randomness;
  if (ConsumesRandomness(*handle) && (op.rng_state.defined() || !DrawsOnlyForDropout(*handle))) {
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
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("not replayable: ", op.func_name, " threw: ", FirstLine(e)));
  }
  for (const c10::IValue& value : stack) {
    ForEachTensor(value, [&](const at::Tensor& t) { result.outputs.push_back(t); });
  }
  result.returns = std::move(stack);
  return result;
}

}  // namespace

absl::StatusOr<ReplayResult> ReplayOp(const Op& op, std::vector<c10::IValue> args) {
  return Run(op, std::move(args));
}

namespace {

// `place.copy_(value)` for `place`, a view of the 1-D `typed_region`, that may be an expanded
// view (`b.expand(2, 3)` changed by `b.add_(x)`): `copy_` refuses a destination whose
// elements share memory, so each element's value is put at its position in the region. The
// elements sharing a position hold one value, as `value` is a view of the same geometry.
void WriteThroughPlace(const at::Tensor& typed_region, const at::Tensor& place,
                       const at::Tensor& value) {
  if (at::has_internal_overlap(place) != at::MemOverlap::Yes) {
    place.copy_(value);
    return;
  }
  const at::Tensor positions =
      at::arange(typed_region.numel(), typed_region.options().dtype(at::kLong))
          .as_strided(place.sizes(), place.strides(), place.storage_offset());
  typed_region.put_(positions, value.contiguous());
}

}  // namespace

absl::StatusOr<at::Tensor> ReplayAliasWrite(const Op& op, const AliasWrite& write,
                                            std::vector<c10::IValue> args,
                                            const at::Tensor& before) {
  // See NOTE [Writes through aliases].
  if (write.written_tensor < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "not replayable: ", op.label,
        " changed the tensor through writes that are not one argument's (a nested kernel's "
        "write, or several arguments on the same bytes)"));
  }
  const at::Tensor written = TensorArgument(args, write.written_tensor);
  if (!Fits(write.written, written) || !Fits(write.aliased, before)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "not replayable: the write of ", op.label,
        " through an alias is recorded with geometries that do not fit its saved values "
        "(another layout or shape)"));
  }
  // In bytes: NOTE [Writes through views of another dtype].
  const int64_t written_size = static_cast<int64_t>(written.element_size());
  const int64_t aliased_size = static_cast<int64_t>(before.element_size());
  const int64_t align = std::max(written_size, aliased_size);
  // A trace file's geometries may be ones no tensor has (strides near 2^62 overflow these
  // sums).
  const absl::StatusOr<std::pair<int64_t, int64_t>> written_range =
      CheckedElementRange(write.written, written_size);
  const absl::StatusOr<std::pair<int64_t, int64_t>> aliased_range =
      CheckedElementRange(write.aliased, aliased_size);
  if (!written_range.ok() || !aliased_range.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "not replayable: the write of ", op.label,
        " through an alias is recorded with a geometry no tensor has (negative, or beyond "
        "64-bit byte offsets)"));
  }
  const auto [written_first, written_end] = *written_range;
  const auto [aliased_first, aliased_end] = *aliased_range;
  const int64_t first = std::min(written_first * written_size, aliased_first * aliased_size);
  const int64_t end = std::max(written_end * written_size, aliased_end * aliased_size);
  const int64_t start = first - first % align;
  const int64_t length = (end - start + align - 1) / align * align;
  const int64_t values = static_cast<int64_t>(written.nbytes() + before.nbytes());
  if (length > kMaxAliasLayoutBytes && length / 64 > values) {
    return absl::FailedPreconditionError(
        absl::StrCat("not replayable: the write of ", op.label, " through an alias spans ", length,
                     " bytes of storage for ", values, " bytes of values (more than ",
                     kMaxAliasLayoutBytes, " bytes and 64 times the values)"));
  }
  c10::impl::ExcludeDispatchKeyGuard not_captured(kCaptureKey);
  at::Tensor region;
  at::Tensor written_place;
  at::Tensor aliased_place;
  try {
    region = at::zeros({length}, before.options().dtype(at::kByte));
    auto place = [&](const TensorGeometry& geometry, const at::Tensor& like) {
      const int64_t size = static_cast<int64_t>(like.element_size());
      return region.view(like.scalar_type())
          .as_strided(geometry.sizes, geometry.strides, geometry.storage_offset - start / size);
    };
    written_place = place(write.written, written);
    aliased_place = place(write.aliased, before);
    // The written argument last: where the two share bytes, its value stands (NOTE
    // [Writes through aliases]).
    WriteThroughPlace(region.view(before.scalar_type()), aliased_place, before);
    written_place.copy_(written);
  } catch (const std::exception& e) {
    return absl::FailedPreconditionError(
        absl::StrCat("not replayable: cannot lay out the write of ", op.label,
                     " through an alias: ", FirstLine(e)));
  }
  int index = 0;
  for (c10::IValue& arg : args) {
    arg = MapTensors(arg, [&](const at::Tensor& t) {
      return index++ == write.written_tensor ? written_place : t;
    });
  }
  // The other tensors the op writes are still cloned: a kernel writing several arguments
  // (the fused fake quantizer's scale and zero point) must not write the saved ones.
  absl::StatusOr<ReplayResult> result = Run(op, std::move(args), {write.written_tensor});
  if (!result.ok()) return result.status();
  return aliased_place.clone();
}

namespace {

// The longest chain of view ops, and of alias writes each naming the one before (one per
// earlier write of the same views: a loop's batch norms), followed back to a buffer version.
constexpr int kMaxViewChain = 16;
constexpr int kMaxAliasWriteChain = 64;

// The tensor output `output` of `node` names as a view: for an alias write's value
// (output < 0), the tensor it changed, which is the one its `before` names.
std::pair<const Op*, int> ViewNamed(const Op* node, int output, const NodeLookup& lookup) {
  for (int depth = 0; node != nullptr && output < 0 && depth <= kMaxAliasWriteChain; ++depth) {
    const size_t k = static_cast<size_t>(-(output + 1));
    if (k >= node->alias_writes.size()) return {nullptr, 0};
    const ArgSource& before = node->alias_writes[k].before;
    node = before.kind == ArgSource::Kind::kNode ? lookup(before.name) : nullptr;
    output = before.output_index;
  }
  return {output < 0 ? nullptr : node, output};
}

// For output `output` of `node`, an argument `node` wrote in place and returns as that
// output (`fill_`'s and `add_`'s self, an out= op's `out`): its tensor index, as in
// FirstTensorOfArguments; -1 for any other output.
int ReturnedWrittenArgument(const Op& node, int output) {
  absl::StatusOr<c10::OperatorHandle> handle = Handle(node);
  if (!handle.ok() || output < 0) return -1;
  const c10::FunctionSchema& schema = handle->schema();
  // Outputs are numbered over the returns' tensors: only returns before `output` that are
  // single tensors keep the two numberings equal.
  if (output >= static_cast<int>(schema.returns().size())) return -1;
  for (int r = 0; r <= output; ++r) {
    if (schema.returns()[r].type()->kind() != c10::TypeKind::TensorType) return -1;
  }
  const c10::AliasInfo* returned = schema.returns()[output].alias_info();
  if (returned == nullptr || !returned->isWrite()) return -1;
  const std::vector<int> first = FirstTensorOfArguments(node);
  for (size_t a = 0; a < schema.arguments().size() && a < first.size(); ++a) {
    const c10::AliasInfo* alias = schema.arguments()[a].alias_info();
    if (alias != nullptr && alias->isWrite() && alias->beforeSets() == returned->beforeSets()) {
      return first[a];
    }
  }
  return -1;
}

// One step from a view toward what it was made of: the tensor argument of `node` that
// output `output` is made of (the written argument it returns, else the first), and
// whether that output is the argument itself, so that nothing is re-run to make it, or the
// argument itself with another geometry (NOTE [In-place view ops] in
// torchlens_dispatch/recorder.h), remade by re-running the op on an alias of it.
struct ViewSource {
  const ArgSource* source = nullptr;
  bool same_tensor = false;
  bool inplace_view = false;
};
ViewSource SourceOfView(const Op& node, int output) {
  const int written = ReturnedWrittenArgument(node, output);
  const int index = written >= 0 ? written : 0;
  if (!node.is_compute() || index >= static_cast<int>(node.arg_sources.size()) ||
      node.arg_sources[index].kind != ArgSource::Kind::kNode) {
    return {};
  }
  if (written < 0) return {&node.arg_sources[index], false, false};
  absl::StatusOr<c10::OperatorHandle> handle = Handle(node);
  const bool inplace_view = handle.ok() && IsInplaceView(*handle);
  return {&node.arg_sources[index], !inplace_view, inplace_view};
}

// The buffer version a view was made of: up the tensors each step names (and through alias
// writes' values to the tensors they changed) to the first buffer version, or null.
const Op* RootVersion(const Op* node, int output, const NodeLookup& lookup) {
  for (int depth = 0; depth <= kMaxViewChain; ++depth) {
    std::tie(node, output) = ViewNamed(node, output, lookup);
    if (node == nullptr || node->is_buffer) return node;
    const ViewSource step = SourceOfView(*node, output);
    if (step.source == nullptr) return nullptr;
    output = step.source->output_index;
    node = lookup(step.source->name);
  }
  return nullptr;
}

// The version of `root`'s buffer that `op` wrote through views made of `root`: the one
// before the version `op` made. Views made of an earlier version see every in-place write
// since, unless the buffer was reassigned in between, when the views are of a tensor the
// buffer no longer is (null). `root` itself when `op` made no later version of it.
const Op* VersionBeforeWrite(const Op& op, const Op& root, const NodeLookup& lookup) {
  for (const std::string& child : op.children) {
    const Op* written = lookup(child);
    if (written == nullptr || !written->is_buffer || written->address != root.address ||
        written->buffer_pass <= root.buffer_pass) {
      continue;
    }
    absl::StatusOr<ParsedKey> key = ParseKey(written->label);
    if (!key.ok()) return nullptr;
    const Op* before = &root;
    for (int pass = root.buffer_pass + 1; pass < written->buffer_pass; ++pass) {
      before = lookup(PassLabel(key->base, pass));
      if (before == nullptr || !before->is_buffer || before->address != root.address ||
          before->buffer_write_kind == WriteKind::kReassign) {
        return nullptr;
      }
    }
    return before;
  }
  return &root;
}

// Output `output` of `view`, made again of `base` (the value of a version of buffer
// `address`) by re-running the view ops between them, each on the tensor SourceOfView
// names; an op that returns an argument it wrote is not re-run (`base` holds its write).
// An error unless every step is a view of `base`. See NOTE [Fused writes through views].
absl::StatusOr<at::Tensor> RemadeView(const Op* view, int output, const std::string& address,
                                      const at::Tensor& base, const NodeLookup& lookup, int depth) {
  std::tie(view, output) = ViewNamed(view, output, lookup);
  if (view == nullptr || depth > kMaxViewChain) {
    return absl::FailedPreconditionError("not a chain of views of a buffer");
  }
  if (view->is_buffer) {
    if (view->address == address) return base;
    return absl::FailedPreconditionError(absl::StrCat(view->label, " is another buffer"));
  }
  const ViewSource step = SourceOfView(*view, output);
  if (step.source == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(view->label, " is not a view"));
  }
  absl::StatusOr<at::Tensor> parent_view = RemadeView(
      lookup(step.source->name), step.source->output_index, address, base, lookup, depth + 1);
  if (!parent_view.ok() || step.same_tensor) return parent_view;
  // An in-place view op changes the geometry of the tensor it is given: an alias of the
  // parent view, made for the call.
  std::vector<c10::IValue> args =
      ReplayArguments(*view, [&](int index, const ArgSource&, const at::Tensor& saved) {
        if (index != 0) return saved;
        return step.inplace_view ? parent_view->alias() : *parent_view;
      });
  absl::StatusOr<ReplayResult> remade = step.inplace_view
                                            ? Run(*view, std::move(args), /*private_tensors=*/{0})
                                            : Run(*view, std::move(args));
  if (!remade.ok()) return remade.status();
  if (output >= static_cast<int>(remade->outputs.size()) || !remade->outputs[output].defined() ||
      !remade->outputs[output].is_alias_of(base)) {
    return absl::FailedPreconditionError(absl::StrCat(view->label, " is not a view"));
  }
  return remade->outputs[output];
}

}  // namespace

const at::Tensor* FusedWriteRedone::After(const std::string& address) const {
  for (const auto& [before, after] : buffers) {
    if (before->address == address) return &after;
  }
  return nullptr;
}

absl::StatusOr<FusedWriteRedone> RedoFusedWriteThroughViews(const Op& op,
                                                            const NodeLookup& lookup) {
  // See NOTE [Fused writes through views].
  const FusedMutator* fused = FindFusedMutator(op.func_name);
  std::vector<c10::IValue> args =
      ReplayArguments(op, [](int, const ArgSource&, const at::Tensor& saved) { return saved; });
  if (fused == nullptr || !UpdatesState(*fused, args)) {
    return absl::FailedPreconditionError(
        absl::StrCat(op.label, " is not a fused mutator updating its state"));
  }
  const std::vector<int> first = FirstTensorOfArguments(op);
  // The tensor indexes of the state arguments.
  std::vector<int> states;
  for (int s = 0; s < fused->num_state_arguments; ++s) {
    const int argument = fused->state_arguments[s];
    const int tensor_index = argument < static_cast<int>(first.size()) ? first[argument] : -1;
    if (tensor_index >= 0 && tensor_index < static_cast<int>(op.arg_sources.size())) {
      states.push_back(tensor_index);
    }
  }
  if (std::none_of(states.begin(), states.end(), [&](int tensor_index) {
        const ArgSource& source = op.arg_sources[tensor_index];
        const Op* state = source.kind == ArgSource::Kind::kNode ? lookup(source.name) : nullptr;
        return state != nullptr && !state->is_buffer;
      })) {
    // Every state argument is a buffer itself: NOTE [Fused buffer writes] checks those
    // with the op's own replay, and redoing it here would run the kernel twice more.
    return absl::FailedPreconditionError(
        absl::StrCat(op.label, " writes no buffer through a view"));
  }
  FusedWriteRedone redone;
  std::vector<std::pair<int, at::Tensor>> views;  // tensor index -> view of a copy
  c10::impl::ExcludeDispatchKeyGuard not_captured(kCaptureKey);
  for (int tensor_index : states) {
    const ArgSource& source = op.arg_sources[tensor_index];
    if (source.kind != ArgSource::Kind::kNode) {
      return absl::FailedPreconditionError(
          absl::StrCat(op.label, "'s state argument ", tensor_index, " is not a buffer's view"));
    }
    const Op* state = lookup(source.name);
    const Op* made_of = RootVersion(state, source.output_index, lookup);
    const Op* root = made_of == nullptr ? nullptr : VersionBeforeWrite(op, *made_of, lookup);
    if (root == nullptr || !root->out.defined()) {
      return absl::FailedPreconditionError(
          absl::StrCat(op.label, "'s state argument ", tensor_index, " is not a buffer's view"));
    }
    const at::Tensor* copy = redone.After(root->address);
    if (copy == nullptr) {
      redone.buffers.emplace_back(root, StridedCopy(root->out));
      copy = &redone.buffers.back().second;
    }
    absl::StatusOr<at::Tensor> view =
        RemadeView(state, source.output_index, root->address, *copy, lookup, 0);
    if (!view.ok()) return view.status();
    views.emplace_back(tensor_index, *std::move(view));
  }
  if (redone.buffers.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(op.label, " has no state argument"));
  }

  std::vector<int> private_tensors;
  int index = 0;
  for (c10::IValue& arg : args) {
    arg = MapTensors(arg, [&](const at::Tensor& t) {
      const int i = index++;
      for (const auto& [tensor_index, view] : views) {
        if (tensor_index == i) {
          private_tensors.push_back(i);
          return view;
        }
      }
      return t;
    });
  }
  absl::StatusOr<ReplayResult> result = Run(op, std::move(args), private_tensors);
  if (!result.ok()) return result.status();
  return redone;
}

absl::StatusOr<at::Tensor> ViewAfterFusedWrite(const Op& view, int output,
                                               const FusedWriteRedone& redone,
                                               const NodeLookup& lookup) {
  c10::impl::ExcludeDispatchKeyGuard not_captured(kCaptureKey);
  const Op* root = RootVersion(&view, output, lookup);
  const at::Tensor* copy = root == nullptr ? nullptr : redone.After(root->address);
  if (copy == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(view.label, " is not a view of a buffer the call wrote"));
  }
  absl::StatusOr<at::Tensor> remade = RemadeView(&view, output, root->address, *copy, lookup, 0);
  if (!remade.ok()) return remade.status();
  return remade->clone();
}

const ArgSource* ViewedSource(const Op& op, int output) {
  if (!op.is_compute() || output < 0) return nullptr;
  absl::StatusOr<c10::OperatorHandle> handle = Handle(op);
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
