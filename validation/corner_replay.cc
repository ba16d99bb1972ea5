#include "validation/corner_replay.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <string>

#include "absl/strings/string_view.h"
#include "torchlens_dispatch/ops/bit_identical.h"
#include "validation/replay.h"

namespace torchlens {
namespace {

// Where a windowed op's window parameters are among its arguments.
struct WindowArguments {
  int spatial = 0;  // spatial dimensions (trailing dimensions of the input)
  int kernel = -1;  // argument holding the window sizes; -1: the weight's sizes after 2
  int stride = 0;
  int padding = 0;
  int dilation = 0;
  int transposed = -1;  // argument saying whether the convolution is transposed; -1: none
};

std::optional<WindowArguments> WindowArgumentsOf(const Op& op) {
  const absl::string_view name = op.func_name;
  if (name == "aten::conv1d" || name == "aten::conv2d" || name == "aten::conv3d") {
    // The "padding" overload takes "same" or "valid": its window start is not a number.
    if (op.overload_name == "padding") return std::nullopt;
    return WindowArguments{name[10] - '0', -1, 3, 4, 5, -1};
  }
  if (name == "aten::convolution" || name == "aten::_convolution") {
    return WindowArguments{0, -1, 3, 4, 5, 6};
  }
  if (name == "aten::max_pool1d" || name == "aten::max_pool2d" || name == "aten::max_pool3d") {
    return WindowArguments{name[14] - '0', 1, 2, 3, 4, -1};
  }
  return std::nullopt;
}

// Entry `i` of an int list argument given for each spatial dimension or once for all;
// nullopt when the list has another length. An empty stride list means the window size.
std::optional<int64_t> PerDimension(const c10::IValue& list, int i, int spatial) {
  if (!list.isIntList()) return std::nullopt;
  const c10::List<int64_t> values = list.toIntList();
  if (values.size() == 1) return values.get(0);
  if (static_cast<int>(values.size()) != spatial) return std::nullopt;
  return values.get(i);
}

}  // namespace

std::optional<Corner> FindCorner(const Op& op) {
  std::optional<WindowArguments> where = WindowArgumentsOf(op);
  if (!where.has_value()) return std::nullopt;
  const auto& args = op.creation_args;
  const int needed = std::max(
      {where->kernel, where->stride, where->padding, where->dilation, where->transposed, 1});
  if (static_cast<int>(args.size()) <= needed || !args[0].isTensor()) return std::nullopt;
  if (where->transposed >= 0 &&
      (!args[where->transposed].isBool() || args[where->transposed].toBool())) {
    return std::nullopt;
  }
  const at::Tensor& input = args[0].toTensor();
  c10::IntArrayRef kernel_sizes;
  if (where->kernel < 0) {
    if (!args[1].isTensor()) return std::nullopt;
    const at::Tensor& weight = args[1].toTensor();
    if (!weight.defined() || weight.dim() < 3) return std::nullopt;
    kernel_sizes = weight.sizes().slice(2);
    if (where->spatial == 0) where->spatial = static_cast<int>(kernel_sizes.size());
    if (static_cast<int>(kernel_sizes.size()) != where->spatial) return std::nullopt;
  }
  if (!input.defined() || input.layout() != at::kStrided || input.is_meta() ||
      input.is_quantized() || !input.is_floating_point() || input.dim() != where->spatial + 2 ||
      input.size(0) < 1) {
    return std::nullopt;
  }
  const std::vector<int> first = FirstTensorOfArguments(op);
  Corner corner;
  corner.input = first.empty() ? -1 : first[0];
  if (corner.input < 0) return std::nullopt;
  int64_t kept = 2;  // samples
  int64_t whole = input.size(0);
  for (int i = 0; i < where->spatial; ++i) {
    std::optional<int64_t> kernel;
    if (where->kernel < 0) {
      kernel = kernel_sizes[i];
    } else {
      kernel = PerDimension(args[where->kernel], i, where->spatial);
    }
    std::optional<int64_t> stride = PerDimension(args[where->stride], i, where->spatial);
    if (!stride.has_value() && args[where->stride].isIntList() &&
        args[where->stride].toIntList().empty()) {
      stride = kernel;  // max pooling's default stride
    }
    const std::optional<int64_t> padding = PerDimension(args[where->padding], i, where->spatial);
    const std::optional<int64_t> dilation = PerDimension(args[where->dilation], i, where->spatial);
    if (!kernel || !stride || !padding || !dilation || *kernel < 1 || *kernel > (1 << 20) ||
        *stride < 1 || *padding < 0 || *dilation < 1 || *dilation > (1 << 20)) {
      return std::nullopt;
    }
    const int64_t size = input.size(input.dim() - where->spatial + i);
    // The window at output position 0 covers [-padding, dilation * (kernel - 1) - padding].
    const int64_t reach = *dilation * (*kernel - 1) - *padding + 1;
    if (reach < 1 || size < 1) return std::nullopt;  // it reads padding only
    const int64_t extent = std::min(size, reach);
    corner.extent.push_back(extent);
    kept *= extent;
    whole *= size;
  }
  // A pair of corners near the input's size saves less than its extra call costs.
  if (kept > whole / 4) return std::nullopt;
  return corner;
}

std::optional<std::vector<c10::IValue>> CornerPairArguments(
    const Op& op, const Corner& corner, const std::vector<int>& perturbed_tensors,
    absl::FunctionRef<std::optional<at::Tensor>(const at::Tensor& corner)> perturb) {
  if (perturbed_tensors.size() != 1 || perturbed_tensors[0] != corner.input) return std::nullopt;
  bool perturbed = true;
  std::vector<c10::IValue> args =
      ReplayArguments(op, [&](int index, const ArgSource&, const at::Tensor& saved) {
        if (index != corner.input || !perturbed) return saved;
        at::Tensor first = saved.narrow(0, 0, 1);
        const int64_t first_spatial = saved.dim() - static_cast<int64_t>(corner.extent.size());
        for (size_t i = 0; i < corner.extent.size(); ++i) {
          first = first.narrow(first_spatial + static_cast<int64_t>(i), 0, corner.extent[i]);
        }
        std::optional<at::Tensor> changed = perturb(first);
        if (!changed.has_value()) {
          perturbed = false;
          return saved;
        }
        return at::cat({first, *changed}, 0);
      });
  if (!perturbed) return std::nullopt;
  return args;
}

bool PairSamplesDiffer(const Corner& corner, const std::vector<at::Tensor>& outputs) {
  const int64_t spatial = static_cast<int64_t>(corner.extent.size());
  for (const at::Tensor& output : outputs) {
    if (!output.defined() || output.dim() != spatial + 2 || output.size(0) != 2) continue;
    at::Tensor first = output;
    for (int64_t i = 0; i < spatial; ++i) first = first.select(-1, 0);  // [2, channels]
    if (first.numel() > 0 && !BitIdentical(first[0], first[1])) return true;
  }
  return false;
}

}  // namespace torchlens
