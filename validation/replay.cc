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
#include "torchlens_dispatch/ops/bit_identical.h"
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

}  // namespace

absl::StatusOr<ReplayResult> ReplayOp(const Op& op, std::vector<c10::IValue> args,
                                      absl::Span<const int> private_tensors) {
  absl::StatusOr<c10::OperatorHandle> handle = OperatorOf(op);
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
  absl::StatusOr<ReplayResult> result = ReplayOp(op, std::move(args), {write.written_tensor});
  if (!result.ok()) return result.status();
  return aliased_place.clone();
}

bool SameNonTensorReturns(const ReplayResult& a, const ReplayResult& b) {
  if (a.returns.size() != b.returns.size()) return false;
  for (size_t i = 0; i < a.returns.size(); ++i) {
    if (!ContainsTensor(a.returns[i]) && !(a.returns[i] == b.returns[i])) return false;
  }
  return true;
}

bool SameReturns(const ReplayResult& a, const ReplayResult& b) {
  if (a.outputs.size() != b.outputs.size()) return false;
  for (size_t i = 0; i < a.outputs.size(); ++i) {
    if (!BitIdentical(a.outputs[i], b.outputs[i])) return false;
  }
  return SameNonTensorReturns(a, b);
}

}  // namespace torchlens
