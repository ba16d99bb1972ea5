#include "graph/compare.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "graph/release_after_last_use.h"

namespace torchlens {
namespace {

std::string Shape(c10::IntArrayRef shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::vector<at::Tensor> Outputs(const Op& op) {
  if (!op.outs.empty()) return op.outs.ToVector();
  return {op.out};
}

bool Numeric(const at::Tensor& t) {
  return t.defined() && t.layout() == at::kStrided && !t.is_quantized() && !t.is_meta();
}

// Folds the differences of one chunk of an output pair into `node`; false when they are
// not close.
bool CompareChunk(const at::Tensor& x, const at::Tensor& y, const CompareOptions& options,
                  NodeComparison* node) {
  const at::Tensor both_nan = at::isnan(x) & at::isnan(y);
  const at::Tensor same = (x == y) | both_nan;  // also equal infinities
  const at::Tensor diff = at::where(same, at::zeros_like(x), (x - y).abs());
  const at::Tensor safe = at::where(at::isnan(diff), at::full_like(diff, INFINITY), diff);
  node->max_abs_diff = std::max(node->max_abs_diff, safe.max().item<double>());
  const at::Tensor nonzero = y.abs() > 0;
  if (nonzero.any().item<bool>()) {
    node->max_rel_diff = std::max(
        node->max_rel_diff,
        (safe.masked_select(nonzero) / y.abs().masked_select(nonzero)).max().item<double>());
  }
  // A difference from a zero is infinitely large relative to it, never "0".
  if ((~nonzero & (safe > 0)).any().item<bool>()) node->max_rel_diff = INFINITY;
  return (same | (safe <= options.atol + options.rtol * y.abs())).all().item<bool>();
}

// Folds the differences of one output pair into `node`; false when they are not close.
// Compared in chunks of kChunk elements in double: the working memory of comparing two
// values read from files stays a few chunks, whatever the values' size.
bool CompareValues(const at::Tensor& a, const at::Tensor& b, const CompareOptions& options,
                   NodeComparison* node) {
  constexpr int64_t kChunk = int64_t{1} << 20;
  const at::Tensor x = (a.is_complex() ? at::view_as_real(a.resolve_conj()) : a).reshape(-1);
  const at::Tensor y = (b.is_complex() ? at::view_as_real(b.resolve_conj()) : b).reshape(-1);
  bool close = true;
  for (int64_t start = 0; start < x.numel(); start += kChunk) {
    const int64_t length = std::min(kChunk, x.numel() - start);
    close = CompareChunk(x.narrow(0, start, length).to(at::kDouble),
                         y.narrow(0, start, length).to(at::kDouble), options, node) &&
            close;
  }
  return close;
}

std::vector<at::Tensor> Grads(const Op& op) {
  if (!op.grads.empty()) return op.grads;
  return {op.grad};
}

// Folds the differences of gradient lists `a` and `b` into `node`'s gradient fields.
void CompareGrads(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b,
                  const CompareOptions& options, NodeComparison* node) {
  NodeComparison values;
  for (size_t k = 0; k < std::max(a.size(), b.size()); ++k) {
    const at::Tensor x = k < a.size() ? a[k] : at::Tensor();
    const at::Tensor y = k < b.size() ? b[k] : at::Tensor();
    if (!x.defined() && !y.defined()) continue;
    node->grads_compared = true;
    if (x.defined() != y.defined() || !Numeric(x) || !Numeric(y) || x.sizes() != y.sizes()) {
      node->differences.push_back(
          x.defined() != y.defined()
              ? absl::StrCat("gradient of output ", k, " in ", x.defined() ? "a" : "b", " only")
              : absl::StrCat("gradient of output ", k, " of shape ", Shape(x.sizes()), " vs ",
                             Shape(y.sizes())));
      node->grad_diverged = true;
      continue;
    }
    if (!CompareValues(x, y, options, &values)) node->grad_diverged = true;
  }
  node->max_abs_grad_diff = values.max_abs_diff;
  node->max_rel_grad_diff = values.max_rel_diff;
}

}  // namespace

absl::StatusOr<Comparison> Compare(const Trace& a, const Trace& b, CompareOptions options) {
  if (options.atol < 0 || options.rtol < 0) {
    return absl::InvalidArgumentError(absl::StrCat("tolerances must not be negative (atol ",
                                                   options.atol, ", rtol ", options.rtol, ")"));
  }
  Comparison comparison;
  for (const Op& op : b.ops()) {
    if (a.IndexOfLabel(op.label) < 0) comparison.only_in_b.push_back(op.label);
  }
  // Traces read from files give back each value's pages once it is compared: step i
  // compares a's op i with b's op of the same label.
  auto values_of = [](const Op* op, const TensorVisitor& visit) {
    if (op == nullptr) return;
    for (const at::Tensor& t : Outputs(*op)) visit(t);
    for (const at::Tensor& t : Grads(*op)) visit(t);
  };
  auto in_b = [&](size_t i) {
    const int other = b.IndexOfLabel(a.ops()[i].label);
    return other < 0 ? nullptr : &b.ops()[other];
  };
  ReleaseAfterLastUse pages_a(
      a.ops().size(), [&](size_t i, const TensorVisitor& visit) { values_of(&a.ops()[i], visit); });
  ReleaseAfterLastUse pages_b(
      a.ops().size(), [&](size_t i, const TensorVisitor& visit) { values_of(in_b(i), visit); });
  for (size_t i = 0; i < a.ops().size(); ++i) {
    const Op& x = a.ops()[i];
    const Op* found = in_b(i);
    if (found == nullptr) {
      comparison.only_in_a.push_back(x.label);
      pages_a.Done(i);
      continue;
    }
    const Op& y = *found;
    NodeComparison node;
    node.label = x.label;
    if (x.func_name != y.func_name || x.overload_name != y.overload_name || x.type != y.type) {
      node.differences.push_back(absl::StrCat("operator ", x.func_name, x.type.empty() ? "" : " ",
                                              x.type, " vs ", y.func_name, " ", y.type));
    }
    if (x.parents != y.parents) {
      node.differences.push_back(absl::StrCat("parents [", absl::StrJoin(x.parents, ", "), "] vs [",
                                              absl::StrJoin(y.parents, ", "), "]"));
    }
    if (x.module_address != y.module_address) {
      node.differences.push_back(
          absl::StrCat("module '", x.module_address, "' vs '", y.module_address, "'"));
    }
    const bool same_shape = c10::IntArrayRef(x.tensor_shape) == c10::IntArrayRef(y.tensor_shape);
    if (!same_shape) {
      node.differences.push_back(
          absl::StrCat("shape ", Shape(x.tensor_shape), " vs ", Shape(y.tensor_shape)));
    }
    node.diverged = !node.differences.empty();
    if (x.tensor_dtype != y.tensor_dtype) {
      node.differences.push_back(absl::StrCat("dtype ", x.tensor_dtype, " vs ", y.tensor_dtype));
    }
    const std::vector<at::Tensor> xs = Outputs(x);
    const std::vector<at::Tensor> ys = Outputs(y);
    if (same_shape && xs.size() == ys.size()) {
      node.values_compared = true;
      for (size_t k = 0; k < xs.size(); ++k) {
        if (!Numeric(xs[k]) || !Numeric(ys[k]) || xs[k].sizes() != ys[k].sizes()) {
          node.values_compared = node.values_compared && !xs[k].defined() && !ys[k].defined();
          continue;
        }
        if (!CompareValues(xs[k], ys[k], options, &node)) node.diverged = true;
      }
    }
    if (node.diverged && !comparison.first_divergence.has_value()) {
      comparison.first_divergence = node.label;
    }
    if (a.records_gradients() && b.records_gradients()) {
      CompareGrads(Grads(x), Grads(y), options, &node);
    }
    pages_a.Done(i);
    pages_b.Done(i);
    comparison.nodes.push_back(std::move(node));
  }
  if (!a.records_gradients() || !b.records_gradients()) return comparison;
  comparison.grads_compared = true;
  for (auto node = comparison.nodes.rbegin(); node != comparison.nodes.rend(); ++node) {
    if (node->grad_diverged) {
      comparison.first_gradient_divergence = node->label;
      break;
    }
  }
  std::set<std::string> params;
  for (const auto& [address, grad] : a.param_grads()) params.insert(address);
  for (const auto& [address, grad] : b.param_grads()) params.insert(address);
  for (const std::string& address : params) {
    NodeComparison param;
    param.label = address;
    auto x = a.param_grads().find(address);
    auto y = b.param_grads().find(address);
    CompareGrads({x == a.param_grads().end() ? at::Tensor() : x->second},
                 {y == b.param_grads().end() ? at::Tensor() : y->second}, options, &param);
    comparison.param_grads.push_back(std::move(param));
  }
  return comparison;
}

std::string FormatComparison(const Comparison& comparison) {
  const bool grads = comparison.grads_compared;
  auto diff = [](bool compared, double value) {
    return compared ? absl::StrFormat("%.3g", value) : std::string("-");
  };
  std::string out = absl::StrFormat("%-28s %14s %14s", "node", "max abs diff", "max rel diff");
  if (grads) absl::StrAppend(&out, absl::StrFormat(" %14s %14s", "grad abs diff", "grad rel diff"));
  absl::StrAppend(&out, "  differences\n");
  for (const NodeComparison& node : comparison.nodes) {
    absl::StrAppend(&out, absl::StrFormat("%-28s %14s %14s", node.label,
                                          diff(node.values_compared, node.max_abs_diff),
                                          diff(node.values_compared, node.max_rel_diff)));
    if (grads) {
      absl::StrAppend(
          &out, absl::StrFormat(" %14s %14s", diff(node.grads_compared, node.max_abs_grad_diff),
                                diff(node.grads_compared, node.max_rel_grad_diff)));
    }
    absl::StrAppend(&out, "  ", absl::StrJoin(node.differences, "; "));
    if (comparison.first_divergence == node.label) absl::StrAppend(&out, "  <- first divergence");
    if (comparison.first_gradient_divergence == node.label) {
      absl::StrAppend(&out, "  <- first gradient divergence");
    }
    absl::StrAppend(&out, "\n");
  }
  for (const NodeComparison& param : comparison.param_grads) {
    absl::StrAppend(&out, absl::StrFormat("%-28s %14s %14s %14s %14s  %s%s\n",
                                          absl::StrCat("param ", param.label), "-", "-",
                                          diff(param.grads_compared, param.max_abs_grad_diff),
                                          diff(param.grads_compared, param.max_rel_grad_diff),
                                          absl::StrJoin(param.differences, "; "),
                                          param.grad_diverged ? "  <- diverged" : ""));
  }
  if (!comparison.only_in_a.empty()) {
    absl::StrAppend(&out, "only in the first: ", absl::StrJoin(comparison.only_in_a, ", "), "\n");
  }
  if (!comparison.only_in_b.empty()) {
    absl::StrAppend(&out, "only in the second: ", absl::StrJoin(comparison.only_in_b, ", "), "\n");
  }
  absl::StrAppend(&out,
                  comparison.first_divergence.has_value()
                      ? absl::StrCat("first divergence: ", *comparison.first_divergence)
                      : std::string("no divergence"),
                  "\n");
  if (grads) {
    bool params_diverged = false;
    for (const NodeComparison& param : comparison.param_grads) {
      params_diverged = params_diverged || param.grad_diverged;
    }
    absl::StrAppend(
        &out,
        comparison.first_gradient_divergence.has_value()
            ? absl::StrCat("first gradient divergence: ", *comparison.first_gradient_divergence)
            : std::string("no gradient divergence"),
        params_diverged && !comparison.first_gradient_divergence.has_value()
            ? " among the nodes; parameters' gradients diverged"
            : "",
        "\n");
  }
  return out;
}

}  // namespace torchlens
