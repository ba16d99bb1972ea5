#include "validation/kernel_preconditions.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "torchlens_dispatch/ops/storage_ranges.h"

namespace torchlens {
namespace {

constexpr char kRefusal[] = "torchlens.kernel_preconditions";

absl::Status Refuse(const c10::OperatorName& name, absl::string_view why) {
  return MarkKernelPreconditionRefusal(absl::FailedPreconditionError(absl::StrCat(
      name.name, name.overload_name.empty() ? "" : ".", name.overload_name, " ", why,
      "; LibTorch's kernel does not check it (NOTE [Kernels that trust their arguments] in "
      "validation/kernel_preconditions.h)")));
}

// Operators no forward pass calls by name whose kernels trust their arguments: backward
// kernels, unsafe constructors and internal helpers.
bool NeverReplayed(absl::string_view name) {
  static constexpr const char* kNames[] = {
      "aten::from_file",
      "aten::_reshape_alias",
      "aten::_reshape_alias_copy",
      "aten::segment_reduce",
      "aten::native_channel_shuffle",
      "aten::linalg_ldl_solve",
      "aten::_nested_view_from_buffer",
      "aten::_nested_view_from_buffer_copy",
  };
  for (const char* denied : kNames) {
    if (name == denied) return true;
  }
  return absl::StartsWith(name, "aten::_sparse_") ||
         absl::StartsWith(name, "aten::_sobol_engine_") || absl::StrContains(name, "_backward");
}

const at::Tensor* TensorArg(c10::ArrayRef<c10::IValue> args, size_t i) {
  if (i >= args.size() || !args[i].isTensor() || !args[i].toTensor().defined()) return nullptr;
  return &args[i].toTensor();
}

std::optional<int64_t> IntArg(c10::ArrayRef<c10::IValue> args, size_t i) {
  if (i >= args.size() || !args[i].isInt()) return std::nullopt;
  return args[i].toInt();
}

bool BoolArg(c10::ArrayRef<c10::IValue> args, size_t i) {
  return i < args.size() && args[i].isBool() && args[i].toBool();
}

// The values of an int list or of an integer tensor; nullopt for anything else.
std::optional<std::vector<int64_t>> Ints(const c10::IValue& value) {
  if (value.isIntList()) return value.toIntVector();
  if (value.isTensor() && value.toTensor().defined()) {
    const at::Tensor& t = value.toTensor();
    if (!at::isIntegralType(t.scalar_type(), /*includeBool=*/false) || t.is_quantized() ||
        t.layout() != at::kStrided) {
      return std::nullopt;
    }
    const at::Tensor values = t.to(at::kLong).contiguous();
    return std::vector<int64_t>(values.data_ptr<int64_t>(),
                                values.data_ptr<int64_t>() + values.numel());
  }
  return std::nullopt;
}

bool AllWithin(const std::vector<int64_t>& values, int64_t low, int64_t high) {
  for (const int64_t v : values) {
    if (v < low || v >= high) return false;
  }
  return true;
}

// as_strided's bounds check computes (offset + extent) * element size without overflow
// checks: a geometry whose bytes overflow passes it and points anywhere.
absl::Status CheckStrided(const c10::OperatorName& name, c10::ArrayRef<c10::IValue> args,
                          size_t sizes_at) {
  const at::Tensor* self = TensorArg(args, 0);
  if (self == nullptr || sizes_at + 2 > args.size()) return absl::OkStatus();
  const std::optional<std::vector<int64_t>> sizes = Ints(args[sizes_at]);
  const std::optional<std::vector<int64_t>> strides = Ints(args[sizes_at + 1]);
  if (!sizes.has_value() || !strides.has_value()) return absl::OkStatus();  // the kernel refuses
  int64_t offset = self->storage_offset();
  if (sizes_at + 2 < args.size() && args[sizes_at + 2].isInt()) offset = args[sizes_at + 2].toInt();
  const absl::StatusOr<std::pair<int64_t, int64_t>> range = CheckedElementRange(
      TensorGeometry{*sizes, *strides, offset}, static_cast<int64_t>(self->element_size()));
  if (!range.ok()) return Refuse(name, absl::StrCat("with ", range.status().message()));
  return absl::OkStatus();
}

absl::Status CheckEmbeddingBag(const c10::OperatorName& name, c10::ArrayRef<c10::IValue> args) {
  // (weight, indices, offsets, scale_grad_by_freq, mode, sparse, per_sample_weights,
  // include_last_offset, ...)
  const at::Tensor* indices = TensorArg(args, 1);
  const at::Tensor* offsets_tensor = TensorArg(args, 2);
  if (indices == nullptr || offsets_tensor == nullptr || offsets_tensor->dim() != 1) {
    return absl::OkStatus();
  }
  const std::optional<std::vector<int64_t>> offsets = Ints(args[2]);
  if (!offsets.has_value()) return absl::OkStatus();
  for (size_t i = 0; i < offsets->size(); ++i) {
    if ((*offsets)[i] < 0 || (*offsets)[i] > indices->numel() ||
        (i > 0 && (*offsets)[i] < (*offsets)[i - 1])) {
      return Refuse(name, absl::StrCat("with offsets that are not ascending within the ",
                                       indices->numel(), " indices"));
    }
  }
  if (BoolArg(args, 7) && (offsets->empty() || offsets->back() != indices->numel())) {
    return Refuse(name,
                  "with include_last_offset and a last offset that is not the number "
                  "of indices");
  }
  return absl::OkStatus();
}

absl::Status CheckCtcLoss(const c10::OperatorName& name, c10::ArrayRef<c10::IValue> args) {
  // (log_probs, targets, input_lengths, target_lengths, blank, ...)
  const at::Tensor* log_probs = TensorArg(args, 0);
  if (log_probs == nullptr || log_probs->dim() == 0 || args.size() < 5) return absl::OkStatus();
  const int64_t classes = log_probs->size(-1);
  const std::optional<std::vector<int64_t>> targets = Ints(args[1]);
  const std::optional<std::vector<int64_t>> input_lengths = Ints(args[2]);
  const std::optional<std::vector<int64_t>> target_lengths = Ints(args[3]);
  const std::optional<int64_t> blank = IntArg(args, 4);
  // Padded targets (batch, longest) are read only up to each target's length.
  const at::Tensor* targets_tensor = TensorArg(args, 1);
  if (targets.has_value() && target_lengths.has_value()) {
    const bool padded = targets_tensor != nullptr && targets_tensor->dim() == 2;
    const int64_t row = padded ? targets_tensor->size(1) : 0;
    int64_t next = 0;  // concatenated targets: where the next one starts
    for (size_t i = 0; i < target_lengths->size(); ++i) {
      const int64_t length = (*target_lengths)[i];
      if (length < 0) return Refuse(name, "with a negative target length");
      const int64_t start = padded ? static_cast<int64_t>(i) * row : next;
      if ((padded && length > row) || start + length > static_cast<int64_t>(targets->size())) {
        return Refuse(name, "with target lengths past the targets");
      }
      for (int64_t j = start; j < start + length; ++j) {
        if ((*targets)[static_cast<size_t>(j)] < 0 ||
            (*targets)[static_cast<size_t>(j)] >= classes) {
          return Refuse(name, absl::StrCat("with targets outside the ", classes, " classes"));
        }
      }
      next = start + length;
    }
  }
  if (input_lengths.has_value() && !AllWithin(*input_lengths, 1, INT64_MAX)) {
    return Refuse(name, "with an input length below 1");
  }
  if (blank.has_value() && (*blank < 0 || *blank >= classes)) {
    return Refuse(name, absl::StrCat("with blank ", *blank, " outside the ", classes, " classes"));
  }
  return absl::OkStatus();
}

absl::Status CheckPadPacked(const c10::OperatorName& name, c10::ArrayRef<c10::IValue> args) {
  // (data, batch_sizes, batch_first, padding_value, total_length)
  const at::Tensor* data = TensorArg(args, 0);
  if (data == nullptr || args.size() < 2) return absl::OkStatus();
  const std::optional<std::vector<int64_t>> batch_sizes = Ints(args[1]);
  if (!batch_sizes.has_value()) return absl::OkStatus();
  int64_t total = 0;
  for (size_t i = 0; i < batch_sizes->size(); ++i) {
    const int64_t size = (*batch_sizes)[i];
    if (size < 1 || (i > 0 && size > (*batch_sizes)[i - 1]) ||
        __builtin_add_overflow(total, size, &total)) {
      return Refuse(name, "with batch sizes that are not positive and non-increasing");
    }
  }
  if (batch_sizes->empty() || data->dim() == 0 || total != data->size(0)) {
    return Refuse(name, "with batch sizes that do not add up to the data's length");
  }
  return absl::OkStatus();
}

absl::Status CheckBatchNorm(const c10::OperatorName& name, c10::ArrayRef<c10::IValue> args) {
  // (input, weight, bias, running_mean, running_var, ...)
  const at::Tensor* input = TensorArg(args, 0);
  if (input == nullptr || input->dim() < 2) return absl::OkStatus();
  for (size_t i = 1; i <= 4; ++i) {
    const at::Tensor* parameter = TensorArg(args, i);
    if (parameter != nullptr && parameter->numel() != input->size(1)) {
      return Refuse(name, absl::StrCat("with a parameter or statistic of ", parameter->numel(),
                                       " elements for ", input->size(1), " channels"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckMovingAverageObserver(const c10::OperatorName& name,
                                        c10::ArrayRef<c10::IValue> args) {
  // (self, observer_on, fake_quant_on, running_min, running_max, scale, zero_point,
  // averaging_const, quant_min, quant_max, ch_axis, per_row_fake_quant, symmetric_quant)
  const at::Tensor* self = TensorArg(args, 0);
  const std::optional<int64_t> ch_axis = IntArg(args, 10);
  // Per tensor (-1 is the observers' default), the axis is not used.
  if (self == nullptr || !ch_axis.has_value() || !BoolArg(args, 11)) return absl::OkStatus();
  if (*ch_axis < 0 || *ch_axis >= std::max<int64_t>(self->dim(), 1)) {
    return Refuse(name, absl::StrCat("with ch_axis ", *ch_axis, " outside the input's ",
                                     self->dim(), " dimensions"));
  }
  const int64_t channels = self->dim() > 0 ? self->size(*ch_axis) : 1;
  for (size_t i = 3; i <= 4; ++i) {
    const at::Tensor* running = TensorArg(args, i);
    if (running != nullptr && running->numel() < channels) {
      return Refuse(name, absl::StrCat("with running statistics of ", running->numel(),
                                       " elements for ", channels, " channels"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckFractionalMaxPool(const c10::OperatorName& name, c10::ArrayRef<c10::IValue> args,
                                    int64_t spatial) {
  // (self, kernel_size, output_size, random_samples)
  const at::Tensor* self = TensorArg(args, 0);
  const at::Tensor* samples = TensorArg(args, 3);
  if (self == nullptr || samples == nullptr || self->dim() < spatial + 1) return absl::OkStatus();
  const int64_t batch = self->dim() == spatial + 2 ? self->size(0) : 1;
  const int64_t channels = self->size(-spatial - 1);
  if (samples->sizes() != at::IntArrayRef({batch, channels, spatial})) {
    return Refuse(name, absl::StrCat("with random samples of shape ", c10::str(samples->sizes()),
                                     ", not [", batch, ", ", channels, ", ", spatial, "]"));
  }
  return absl::OkStatus();
}

}  // namespace

bool IsKernelPreconditionRefusal(const absl::Status& status) {
  return status.GetPayload(kRefusal).has_value();
}

absl::Status MarkKernelPreconditionRefusal(absl::Status status) {
  status.SetPayload(kRefusal, absl::Cord("refused"));
  return status;
}

absl::Status CheckKernelPreconditions(const c10::OperatorName& name,
                                      c10::ArrayRef<c10::IValue> args) {
  const absl::string_view op = name.name;
  if (NeverReplayed(op)) {
    return Refuse(name,
                  "is not replayed: no forward pass calls it by name, and it trusts its "
                  "arguments");
  }
  if (op == "aten::as_strided" || op == "aten::as_strided_" || op == "aten::as_strided_copy") {
    return CheckStrided(name, args, 1);
  }
  if (op == "aten::as_strided_scatter") return CheckStrided(name, args, 2);
  if (op == "aten::embedding_bag" || op == "aten::_embedding_bag" ||
      op == "aten::_embedding_bag_forward_only") {
    return CheckEmbeddingBag(name, args);
  }
  if (op == "aten::ctc_loss" || op == "aten::_ctc_loss") return CheckCtcLoss(name, args);
  if (op == "aten::_pad_packed_sequence") return CheckPadPacked(name, args);
  if (op == "aten::native_batch_norm") return CheckBatchNorm(name, args);
  if (op == "aten::fused_moving_avg_obs_fake_quant" ||
      op == "aten::_fused_moving_avg_obs_fq_helper") {
    return CheckMovingAverageObserver(name, args);
  }
  if (op == "aten::fractional_max_pool2d") return CheckFractionalMaxPool(name, args, 2);
  if (op == "aten::fractional_max_pool3d") return CheckFractionalMaxPool(name, args, 3);
  if (op == "aten::bincount") {
    // Its bin count is the largest value plus one, unchecked for overflow.
    const at::Tensor* self = TensorArg(args, 0);
    if (self != nullptr && self->numel() > 0 &&
        at::isIntegralType(self->scalar_type(), /*includeBool=*/false) &&
        self->max().item<int64_t>() >= (int64_t{1} << 31)) {
      return Refuse(name, "with a value of 2^31 or more (as many bins)");
    }
    return absl::OkStatus();
  }
  if (op == "aten::repeat_interleave" && !args.empty()) {
    // (repeats, *, output_size) or (self, repeats, dim, *, output_size): with output_size
    // the kernel skips its check of negative repeats and writes them past the output.
    const size_t repeats_at = name.overload_name == "Tensor" ? 0 : 1;
    if (repeats_at < args.size() && args[repeats_at].isTensor()) {
      const std::optional<std::vector<int64_t>> repeats = Ints(args[repeats_at]);
      if (repeats.has_value() && !AllWithin(*repeats, 0, INT64_MAX)) {
        return Refuse(name, "with a negative repeat");
      }
    }
    return absl::OkStatus();
  }
  if (op == "aten::searchsorted" && args.size() >= 6) {
    // (sorted_sequence, self, *, out_int32, right, side, sorter)
    const at::Tensor* sorted = TensorArg(args, 0);
    const std::optional<std::vector<int64_t>> sorter =
        args[5].isTensor() && args[5].toTensor().defined() ? Ints(args[5]) : std::nullopt;
    if (sorted != nullptr && sorted->dim() > 0 && sorter.has_value() &&
        !AllWithin(*sorter, 0, sorted->size(-1))) {
      return Refuse(name, "with sorter entries outside the sorted sequence");
    }
    return absl::OkStatus();
  }
  if (op == "aten::multilabel_margin_loss" || op == "aten::multilabel_margin_loss_forward") {
    const at::Tensor* self = TensorArg(args, 0);
    const std::optional<std::vector<int64_t>> target =
        args.size() > 1 ? Ints(args[1]) : std::nullopt;
    if (self != nullptr && self->dim() > 0 && target.has_value() &&
        !AllWithin(*target, -1, self->size(-1))) {
      return Refuse(name, "with targets outside the input's classes");
    }
    return absl::OkStatus();
  }
  return absl::OkStatus();
}

}  // namespace torchlens
