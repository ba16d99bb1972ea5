#include "validation/validate.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "graph/fused_mutators.h"
#include "graph/ivalue_tensors.h"
#include "torchlens_dispatch/capture_key.h"
#include "validation/replay.h"

namespace torchlens {
namespace {

// An argument of an operator: (operator name, tensor position in ForEachTensor order; -1
// for every tensor argument).
struct OpArgument {
  absl::string_view op;
  int tensor_index;  // -1: every tensor argument
};

// Arguments whose values cannot change an op's output: tensors it reads only for their
// shape, dtype or device, and destinations it overwrites entirely.
constexpr OpArgument kShapeOnlyArguments[] = {
    {"aten::zeros_like", -1},   {"aten::ones_like", -1}, {"aten::empty_like", -1},
    {"aten::full_like", -1},    {"aten::rand_like", -1}, {"aten::randn_like", -1},
    {"aten::randint_like", -1}, {"aten::new_zeros", -1}, {"aten::new_ones", -1},
    {"aten::new_empty", -1},    {"aten::new_full", -1},  {"aten::expand_as", 1},
    {"aten::view_as", 1},       {"aten::reshape_as", 1}, {"aten::type_as", 1},
    {"aten::to", 1},  // to.other: the second tensor gives only dtype and device
    {"aten::copy_", 0},         {"aten::fill_", 0},      {"aten::zero_", 0},
    {"aten::normal_", 0},       {"aten::uniform_", 0},   {"aten::random_", 0},
    {"aten::exponential_", 0},  {"aten::cauchy_", 0},    {"aten::log_normal_", 0},
    {"aten::geometric_", 0},    {"aten::bernoulli_", 0},
};

// Arguments a kernel reads as indices without bounds checks: a perturbed value would make
// it read outside its input (torchvision's RoI kernels take each box's image index from
// column 0 of `rois` and crashed the zoo test under perturbation). Replay and the edge
// check still cover them.
constexpr OpArgument kUncheckedIndexArguments[] = {
    {"torchvision::roi_align", 1},
    {"torchvision::roi_pool", 1},
    {"torchvision::ps_roi_align", 1},
    {"torchvision::ps_roi_pool", 1},
};

bool UncheckedIndex(const Op& op, int tensor_index) {
  for (const OpArgument& entry : kUncheckedIndexArguments) {
    if (entry.op == op.func_name && entry.tensor_index == tensor_index) return true;
  }
  return false;
}

// Ops whose outputs are uninitialized memory: replay checks their shape and dtype only.
constexpr absl::string_view kUninitializedOutputs[] = {
    "aten::empty",         "aten::empty_like",        "aten::new_empty",
    "aten::empty_strided", "aten::new_empty_strided",
};

bool Uninitialized(const Op& op) {
  for (absl::string_view name : kUninitializedOutputs) {
    if (name == op.func_name) return true;
  }
  return false;
}

// Ops whose result depends only on their arguments' metadata (shape, dtype, layout).
constexpr absl::string_view kMetadataOps[] = {
    "aten::is_floating_point", "aten::is_complex", "aten::size",        "aten::dim",
    "aten::numel",             "aten::stride",     "aten::sym_size",    "aten::sym_numel",
    "aten::sym_stride",        "aten::is_contiguous", "aten::element_size", "aten::is_same_size",
    "aten::_shape_as_tensor",
};

bool ShapeOnly(const Op& op, int tensor_index) {
  for (absl::string_view name : kMetadataOps) {
    if (name == op.func_name) return true;
  }
  for (const OpArgument& entry : kShapeOnlyArguments) {
    if (entry.op == op.func_name &&
        (entry.tensor_index < 0 || entry.tensor_index == tensor_index)) {
      return true;
    }
  }
  return false;
}

// A product with an all-zero factor does not depend on the other factors: stochastic
// depth multiplies a dropped block by a zero mask, and torchvision initializes ViT's head
// weight to zeros. (Operator, the tensor positions that multiply each other.)
struct Product {
  absl::string_view op;
  int factors[2];
};
constexpr Product kProducts[] = {
    {"aten::mul", {0, 1}},    {"aten::mul_", {0, 1}}, {"aten::linear", {0, 1}},
    {"aten::matmul", {0, 1}}, {"aten::mm", {0, 1}},   {"aten::bmm", {0, 1}},
    {"aten::addmm", {1, 2}},  {"aten::conv1d", {0, 1}}, {"aten::conv2d", {0, 1}},
    {"aten::conv3d", {0, 1}},
};

// Whether the parent's tensors (`parent_indexes`) are factors of a product whose other
// factor is all zeros.
bool ZeroedByAnotherArgument(const Op& op, const std::vector<at::Tensor>& saved,
                             const std::vector<int>& parent_indexes) {
  for (const Product& product : kProducts) {
    if (product.op != op.func_name) continue;
    for (int f = 0; f < 2; ++f) {
      const int mine = product.factors[f];
      const int other = product.factors[1 - f];
      if (std::find(parent_indexes.begin(), parent_indexes.end(), mine) == parent_indexes.end() ||
          std::find(parent_indexes.begin(), parent_indexes.end(), other) != parent_indexes.end() ||
          other >= static_cast<int>(saved.size())) {
        continue;
      }
      const at::Tensor& factor = saved[other];
      if (factor.defined() && factor.numel() > 0 && !factor.is_complex() &&
          !(factor != 0).any().item<bool>()) {
        return true;
      }
    }
  }
  return false;
}

// NOTE [Data-dependent exemptions]
// Some arguments cannot change an op's output for the values this pass happened to see.
// They are checked only after every perturbation failed, and exempted only when the saved
// values prove it (TorchLens exempts index arguments and clamp unconditionally):
//   * an index into a source whose elements are all equal selects the same values whatever
//     it holds (detection models index uniform scores);
//   * clamp with min == max returns that value whatever the input;
//   * index_put without accumulation whose indices cover every element of the destination
//     overwrites all of it (torchvision's MultiScaleRoIAlign fills a zeros tensor);
//   * torchvision's nms that kept every box returned the boxes in score order, which the
//     boxes did not decide; with at most one box, neither boxes nor scores decide anything
//     (detection heads run it per class, often on one box).
// (Operator, tensor position of the source or destination.)
struct IndexingOp {
  absl::string_view op;
  int source;
};
constexpr IndexingOp kIndexingOps[] = {
    {"aten::index", 0}, {"aten::index_select", 0}, {"aten::gather", 0}, {"aten::take", 0},
    {"aten::take_along_dim", 0},
};

bool Uniform(const at::Tensor& t) {
  return t.defined() && t.numel() > 0 && !t.is_complex() &&
         at::equal(t, at::full_like(t, t.flatten()[0].item()));
}

bool DataDependentlyExempt(const Op& op, const std::vector<at::Tensor>& saved,
                           const std::vector<int>& parent_indexes, const ReplayResult& result) {
  const auto only = [&](int index) {
    return parent_indexes.size() == 1 && parent_indexes[0] == index;
  };
  for (const IndexingOp& indexing : kIndexingOps) {
    if (indexing.op != op.func_name) continue;
    const bool indexes_only = std::find(parent_indexes.begin(), parent_indexes.end(),
                                        indexing.source) == parent_indexes.end();
    return indexes_only && indexing.source < static_cast<int>(saved.size()) &&
           Uniform(saved[indexing.source]);
  }
  if (op.func_name == "torchvision::nms" && saved.size() >= 2 && saved[1].defined() &&
      result.outputs.size() == 1 && result.outputs[0].defined()) {
    const int64_t boxes = saved[1].numel();
    return boxes <= 1 || (only(0) && result.outputs[0].numel() == boxes);
  }
  if (op.func_name == "aten::clamp" && only(0) && op.creation_args.size() >= 3 &&
      op.creation_args[1].isScalar() && op.creation_args[2].isScalar()) {
    return op.creation_args[1].toScalar().toDouble() == op.creation_args[2].toScalar().toDouble();
  }
  if ((op.func_name == "aten::index_put_" || op.func_name == "aten::index_put") && only(0) &&
      op.creation_args.size() >= 4 && op.creation_args[3].isBool() &&
      !op.creation_args[3].toBool() && !saved.empty() && saved[0].defined()) {
    c10::List<c10::optional<at::Tensor>> indices;
    for (const c10::IValue& index : op.creation_args[1].toListRef()) {
      indices.push_back(index.isNone() ? c10::optional<at::Tensor>()
                                       : c10::optional<at::Tensor>(index.toTensor()));
    }
    const at::Tensor covered = at::zeros(saved[0].sizes(), at::kBool)
                                   .index_put_(indices, at::ones({}, at::kBool));
    return covered.all().item<bool>();
  }
  return false;
}

// Whether two tensors hold the same bits in the same shape and dtype. Contiguous CPU
// tensors compare as bytes: memcmp stops at the first difference, is vectorized, and
// takes NaNs in the same places as equal (at::equal does neither).
bool BitIdentical(const at::Tensor& a, const at::Tensor& b) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined();
  if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) return false;
  if (a.is_contiguous() && b.is_contiguous() && a.device().is_cpu() && b.device().is_cpu() &&
      a.layout() == at::kStrided && b.layout() == at::kStrided && !a.is_quantized()) {
    return a.numel() == 0 || std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
  }
  return at::equal(a, b);
}

// nullopt when `actual` is bit-identical to `expected`; otherwise what differs.
std::optional<std::string> Difference(const at::Tensor& actual, const at::Tensor& expected) {
  if (BitIdentical(actual, expected)) return std::nullopt;
  if (!actual.defined() || !expected.defined()) {
    return std::string(actual.defined() ? "expected no tensor" : "missing tensor");
  }
  if (actual.sizes() != expected.sizes()) {
    return absl::StrCat("shape [", absl::StrJoin(actual.sizes(), ", "), "] instead of [",
                        absl::StrJoin(expected.sizes(), ", "), "]");
  }
  if (actual.scalar_type() != expected.scalar_type()) {
    return absl::StrCat("dtype ", c10::toString(actual.scalar_type()), " instead of ",
                        c10::toString(expected.scalar_type()));
  }
  if (actual.is_floating_point() || actual.is_complex()) {
    const at::Tensor diff = (actual.to(at::kDouble) - expected.to(at::kDouble)).abs();
    const at::Tensor finite = at::where(at::isnan(diff), at::zeros_like(diff), diff);
    if (finite.max().item<double>() == 0 && !at::isnan(diff).any().item<bool>()) {
      return std::string("equal values, different bits (signed zeros or NaN payloads)");
    }
    return absl::StrFormat("max abs difference %.6g%s", finite.max().item<double>(),
                           at::isnan(diff).any().item<bool>() ? " (and NaN placement)" : "");
  }
  return absl::StrCat((actual != expected).sum().item<int64_t>(), " of ", actual.numel(),
                      " elements differ");
}

// The `attempt`-th perturbation of a saved value (0, 1, 2), cheapest first; the op must
// react to one of them. Every element changes in each.
at::Tensor Perturbation(const at::Tensor& value, size_t attempt, at::Generator& generator) {
  if (value.scalar_type() == at::kBool) return at::logical_not(value);
  if (value.is_floating_point() || value.is_complex()) {
    switch (attempt) {
      case 0:
        return at::rsub(value, -1.0);  // -1 - value, one kernel
      case 1:
        return value + 1000.0 * (value.abs().max().item<double>() + 1.0);
      default:
        return at::randn(value.sizes(), generator, value.options()) *
               (3.0 * (value.abs().max().item<double>() + 1.0));
    }
  }
  switch (attempt) {
    case 0:
      return value + 1;
    case 1:
      return value - 1;
    default:
      return -value;
  }
}

// Whether the op's first return aliases an argument (select, slice, view, expand, ...).
bool ReturnsView(const Op& op) {
  if (!op.is_compute()) return false;
  c10::optional<c10::OperatorHandle> handle =
      c10::Dispatcher::singleton().findSchema({op.func_name, op.overload_name});
  if (!handle.has_value() || handle->schema().returns().empty()) return false;
  const c10::AliasInfo* alias = handle->schema().returns()[0].alias_info();
  return alias != nullptr && !alias->isWrite();
}

// Whether two runs of an op returned the same: tensors bit for bit, other values (the
// Scalar of `item`, the bool of `equal`) by value.
bool SameReturns(const ReplayResult& a, const ReplayResult& b) {
  if (a.outputs.size() != b.outputs.size() || a.returns.size() != b.returns.size()) return false;
  for (size_t i = 0; i < a.outputs.size(); ++i) {
    if (!BitIdentical(a.outputs[i], b.outputs[i])) return false;
  }
  for (size_t i = 0; i < a.returns.size(); ++i) {
    if (!ContainsTensor(a.returns[i]) && !(a.returns[i] == b.returns[i])) return false;
  }
  return true;
}

class Validator {
 public:
  explicit Validator(const Trace& trace)
      : trace_(trace), generator_(at::make_generator<at::CPUGeneratorImpl>(20240601)) {
    for (const Op& op : trace_.ops()) by_label_.emplace(op.label, &op);
  }

  ValidationReport Run() {
    for (const Op& op : trace_.ops()) {
      if (op.is_compute()) {
        CheckOp(op);
      } else if (op.is_output()) {
        CheckOutput(op);
      }
    }
    for (const Op& op : trace_.ops()) {
      if (op.is_buffer) CheckBufferVersion(op);
    }
    CheckReachability();
    report_.passed = report_.failures.empty();
    return std::move(report_);
  }

 private:
  const Op* Node(absl::string_view label) const {
    auto it = by_label_.find(label);
    return it == by_label_.end() ? nullptr : it->second;
  }

  void Fail(const Op& op, absl::string_view why) {
    report_.failures.push_back(absl::StrCat(op.label, ": ", why));
  }

  // The saved tensors inside op.creation_args, in ForEachTensor order.
  static std::vector<at::Tensor> SavedArguments(const Op& op) {
    std::vector<at::Tensor> tensors;
    for (const c10::IValue& arg : op.creation_args) {
      ForEachTensor(arg, [&](const at::Tensor& t) { tensors.push_back(t); });
    }
    return tensors;
  }

  void CheckOp(const Op& op) {
    ++report_.ops_checked;
    // Edges: the parents are the argument sources, and each argument is its parent's value.
    std::vector<std::string> from_arguments;
    for (const ArgSource& source : op.arg_sources) {
      if (source.kind == ArgSource::Kind::kNode &&
          std::find(from_arguments.begin(), from_arguments.end(), source.name) ==
              from_arguments.end()) {
        from_arguments.push_back(source.name);
      }
    }
    if (from_arguments != op.parents) {
      Fail(op, absl::StrCat("wrong parents: the graph names [", absl::StrJoin(op.parents, ", "),
                            "] but the arguments came from [", absl::StrJoin(from_arguments, ", "),
                            "]"));
    }
    const std::vector<at::Tensor> saved = SavedArguments(op);
    for (size_t i = 0; i < op.arg_sources.size() && i < saved.size(); ++i) {
      const ArgSource& source = op.arg_sources[i];
      if (source.kind != ArgSource::Kind::kNode) continue;
      const Op* parent = Node(source.name);
      if (parent == nullptr) {
        Fail(op, absl::StrCat("wrong parent: argument ", i, " names unknown node ", source.name));
        continue;
      }
      if (source.output_index < 0) continue;  // NOTE [Writes through views]: not an output
      const at::Tensor parent_value = source.output_index < static_cast<int>(parent->outs.size())
                                          ? parent->outs[source.output_index]
                                          : parent->out;
      if (parent_value.defined() &&
          saved[i].unsafeGetTensorImpl() == parent_value.unsafeGetTensorImpl()) {
        continue;
      }
      if (std::optional<std::string> diff = Difference(saved[i], parent_value)) {
        Fail(op, absl::StrCat("wrong parent: argument ", i, " is not the saved output of ",
                              source.name, " (", *diff, ")"));
      }
    }

    // Replay.
    std::vector<c10::IValue> args =
        ReplayArguments(op, [](int, const ArgSource&, const at::Tensor& value) { return value; });
    absl::StatusOr<ReplayResult> replay = ReplayOp(op, args);
    if (!replay.ok()) {
      Fail(op, replay.status().message());
      return;
    }
    if (replay->outputs.size() != op.outs.size()) {
      Fail(op, absl::StrCat("replay returned ", replay->outputs.size(),
                            " tensors, the trace saved ", op.outs.size()));
      return;
    }
    for (size_t k = 0; k < op.outs.size(); ++k) {
      const at::Tensor& expected = op.outs[k];
      const at::Tensor& actual = replay->outputs[k];
      if (Uninitialized(op)) {
        if (actual.sizes() != expected.sizes() || actual.scalar_type() != expected.scalar_type()) {
          Fail(op, absl::StrCat("output ", k, " has another shape or dtype than captured"));
        }
        continue;
      }
      if (std::optional<std::string> diff = Difference(actual, expected)) {
        Fail(op, absl::StrCat("value mismatch on output ", k, " (", *diff, ")"));
      }
    }
    CheckFusedTransitions(op, *replay);
    if (!Uninitialized(op)) CheckPerturbations(op, *replay);
  }

  // NOTE [Fused buffer writes]: the re-run from the previous version's state must produce
  // the captured version.
  void CheckFusedTransitions(const Op& op, const ReplayResult& replay) {
    if (replay.state_after.empty()) return;
    const FusedMutator* fused = FindFusedMutator(op.func_name);
    // Tensor index (ForEachTensor order) of each argument position.
    std::vector<int> first_tensor(op.creation_args.size(), -1);
    int index = 0;
    for (size_t a = 0; a < op.creation_args.size(); ++a) {
      ForEachTensor(op.creation_args[a], [&](const at::Tensor&) {
        if (first_tensor[a] < 0) first_tensor[a] = index;
        ++index;
      });
    }
    for (const auto& [argument, after] : replay.state_after) {
      const int tensor_index =
          argument < static_cast<int>(first_tensor.size()) ? first_tensor[argument] : -1;
      if (tensor_index < 0 || tensor_index >= static_cast<int>(op.arg_sources.size())) continue;
      const Op* previous = Node(op.arg_sources[tensor_index].name);
      if (previous == nullptr || !previous->is_buffer) continue;  // not a registered buffer
      const Op* version = nullptr;
      for (const std::string& child : op.children) {
        const Op* candidate = Node(child);
        if (candidate != nullptr && candidate->is_buffer &&
            candidate->address == previous->address &&
            candidate->buffer_write_kind == WriteKind::kFused) {
          version = candidate;
        }
      }
      if (version == nullptr) {
        Fail(op, absl::StrCat("updated ", previous->address, " (", fused ? fused->name : "",
                              ") but the trace has no fused version for it"));
        continue;
      }
      fused_checked_.insert(version);
      if (std::optional<std::string> diff = Difference(after, version->out)) {
        Fail(*version,
             absl::StrCat("fused write of ", version->address, " differs from re-running ",
                          op.label, " from ", previous->label, " (", *diff, ")"));
      }
    }
  }

  void CheckPerturbations(const Op& op, const ReplayResult& unperturbed) {
    // An op whose tensor outputs are all empty has no value a parent could change.
    if (!unperturbed.outputs.empty() &&
        std::all_of(unperturbed.outputs.begin(), unperturbed.outputs.end(),
                    [](const at::Tensor& t) { return t.defined() && t.numel() == 0; })) {
      return;
    }
    const FusedMutator* fused = FindFusedMutator(op.func_name);
    const std::vector<c10::IValue> plain =
        ReplayArguments(op, [](int, const ArgSource&, const at::Tensor& value) { return value; });
    const bool updating = fused != nullptr && UpdatesState(*fused, plain);
    // Tensor indexes that are fused state arguments.
    absl::flat_hash_set<int> state_tensors;
    if (updating) {
      int index = 0;
      for (size_t a = 0; a < op.creation_args.size(); ++a) {
        ForEachTensor(op.creation_args[a], [&](const at::Tensor&) {
          if (IsStateArgument(*fused, static_cast<int>(a))) state_tensors.insert(index);
          ++index;
        });
      }
    }
    const std::vector<at::Tensor> saved = SavedArguments(op);
    for (const std::string& parent : op.parents) {
      // The tensor arguments that come from this parent and can matter.
      std::vector<int> indexes;
      for (int i = 0; i < static_cast<int>(op.arg_sources.size()); ++i) {
        const ArgSource& source = op.arg_sources[i];
        if (source.kind == ArgSource::Kind::kNode && source.name == parent && !ShapeOnly(op, i) &&
            !UncheckedIndex(op, i) && !state_tensors.contains(i)) {
          indexes.push_back(i);
        }
      }
      if (indexes.empty()) continue;
      if (ZeroedByAnotherArgument(op, saved, indexes)) continue;
      bool empty = true;
      for (int i : indexes)
        empty = empty && (i >= static_cast<int>(saved.size()) || saved[i].numel() == 0);
      if (empty) continue;
      bool reacted = false;
      for (size_t attempt = 0; attempt < 3 && !reacted; ++attempt) {
        std::vector<c10::IValue> args =
            ReplayArguments(op, [&](int index, const ArgSource&, const at::Tensor& value) {
              if (std::find(indexes.begin(), indexes.end(), index) == indexes.end()) return value;
              return Perturbation(value, attempt, generator_);
            });
        absl::StatusOr<ReplayResult> perturbed = ReplayOp(op, std::move(args));
        // An op that rejects the perturbed value depends on it too.
        reacted = !perturbed.ok() || !SameReturns(*perturbed, unperturbed);
      }
      if (reacted) {
        ++report_.perturbations_checked;
      } else if (!DataDependentlyExempt(op, saved, indexes, unperturbed)) {  // NOTE [Data-dependent exemptions]
        Fail(op, absl::StrCat("perturbing parent ", parent, " does not change the output"));
      }
    }
  }

  void CheckOutput(const Op& op) {
    ++report_.ops_checked;
    if (op.parents.size() != 1) {
      Fail(op, absl::StrCat("an output needs exactly one parent, has ", op.parents.size()));
      return;
    }
    const Op* parent = Node(op.parents[0]);
    if (parent == nullptr) {
      Fail(op, absl::StrCat("wrong parent: unknown node ", op.parents[0]));
      return;
    }
    // NOTE [Writes through views]: a base its parent wrote through a view is none of the
    // parent's outputs (postprocessing that scales `boxes[:, 0]` in place returns `boxes`).
    if (!op.arg_sources.empty() && op.arg_sources[0].output_index < 0) return;
    std::vector<at::Tensor> candidates = parent->outs;
    if (candidates.empty()) candidates.push_back(parent->out);
    for (const at::Tensor& candidate : candidates) {
      if (!Difference(op.out, candidate).has_value()) return;
    }
    Fail(op, absl::StrCat("wrong parent: the output is not a saved output of ", parent->label));
  }

  void CheckBufferVersion(const Op& version) {
    auto buffer = trace_.buffers().find(version.address);
    if (buffer == trace_.buffers().end()) {
      Fail(version, absl::StrCat("names unknown buffer ", version.address));
      return;
    }
    if (!version.buffer_write_kind.has_value()) {
      ++report_.ops_checked;
      if (std::optional<std::string> diff = Difference(version.out, buffer->second.initial_value)) {
        Fail(version, absl::StrCat("a read of the initial value of ", version.address,
                                   " differs from it (", *diff, ")"));
      }
      return;
    }
    if (fused_checked_.contains(&version)) {
      ++report_.ops_checked;
      return;
    }
    const Op* producer = version.parents.empty() ? nullptr : Node(version.parents[0]);
    if (producer == nullptr) {
      // A reassignment from outside the capture: nothing to compare with.
      if (version.buffer_write_kind == WriteKind::kReassign) {
        report_.state_transition_only.push_back(version.label);
      } else {
        Fail(version, "a write without a producer");
      }
      return;
    }
    std::vector<at::Tensor> candidates = producer->outs;
    if (candidates.empty()) candidates.push_back(producer->out);
    bool full_buffer = false;
    for (const at::Tensor& candidate : candidates) {
      if (!candidate.defined() || candidate.sizes() != version.out.sizes()) continue;
      full_buffer = true;
      if (!Difference(version.out, candidate).has_value()) {
        ++report_.ops_checked;
        return;
      }
    }
    if (full_buffer && version.buffer_write_kind != WriteKind::kFused) {
      Fail(version, absl::StrCat("the written value of ", version.address,
                                 " is not the output of its producer ", producer->label, " (",
                                 *Difference(version.out, candidates.front()), ")"));
      return;
    }
    // The producer's output is only part of the buffer (a slice write), or a fused write
    // made inside a kernel that is not a known fused mutator.
    report_.state_transition_only.push_back(version.label);
  }

  void CheckReachability() {
    std::vector<const Op*> frontier;
    absl::flat_hash_set<const Op*> reached;
    for (const Op& op : trace_.ops()) {
      const bool sink = op.is_output() || (op.is_buffer && op.buffer_write_kind.has_value()) ||
                        (op.is_compute() && op.outs.empty());
      if (sink && reached.insert(&op).second) frontier.push_back(&op);
    }
    while (!frontier.empty()) {
      const Op* op = frontier.back();
      frontier.pop_back();
      for (const std::string& label : op->parents) {
        const Op* parent = Node(label);
        if (parent != nullptr && reached.insert(parent).second) frontier.push_back(parent);
      }
    }
    for (const Op& op : trace_.ops()) {
      // A view nobody reads computed nothing: its result was at most inspected for its
      // shape by code the dispatcher does not see (`x[0].shape`). Neither did an op whose
      // outputs are all empty (a detection head run on zero boxes, whose results only a
      // loop over the boxes would read).
      const bool computed_nothing =
          !op.outs.empty() && std::all_of(op.outs.begin(), op.outs.end(), [](const at::Tensor& t) {
            return t.defined() && t.numel() == 0;
          });
      if (!op.is_input() && !reached.contains(&op) && !ReturnsView(op) && !computed_nothing) {
        Fail(op, "unreachable: not an ancestor of any output or buffer write");
      }
    }
  }

  const Trace& trace_;
  at::Generator generator_;
  absl::flat_hash_map<absl::string_view, const Op*> by_label_;
  absl::flat_hash_set<const Op*> fused_checked_;
  ValidationReport report_;
};

}  // namespace

absl::StatusOr<ValidationReport> ValidateForwardPass(const Trace& trace) {
  if (!trace.has_saved_values()) {
    return absl::FailedPreconditionError(
        "the trace holds no saved values, so there is nothing to replay: capture with "
        "CaptureOptions::save_activations = true (the default) to validate it");
  }
  c10::impl::ExcludeDispatchKeyGuard not_captured(kCaptureKey);
  return Validator(trace).Run();
}

}  // namespace torchlens
