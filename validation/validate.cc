#include "validation/validate.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "graph/dead_nodes.h"
#include "torchlens_dispatch/ops/bit_identical.h"
#include "torchlens_dispatch/ops/capture_key.h"
#include "torchlens_dispatch/ops/exception_text.h"
#include "torchlens_dispatch/ops/exemptions.h"
#include "torchlens_dispatch/ops/ivalue_tensors.h"
#include "validation/corner_replay.h"
#include "validation/fused_views.h"
#include "validation/kernel_preconditions.h"
#include "validation/perturbed_tensors.h"
#include "validation/replay.h"
#include "validation/values.h"

namespace torchlens {
namespace {

// The arguments `op` was called with, as the op tables read them.
c10::ArrayRef<c10::IValue> Arguments(const Op& op) {
  return c10::ArrayRef<c10::IValue>(op.creation_args.data(), op.creation_args.size());
}

// Whether two runs of an op returned the same: tensors bit for bit, other values (the
// Scalar of `item`, the bool of `equal`) by value.
// NOTE [Elements a resize leaves uninitialized]
// `resize_` and `resize_as_` growing a tensor past the elements it had leave the new ones
// uninitialized, as `empty` does: its saved value and its replay each hold whatever memory
// they got there. Replay compares the elements the tensor had, the first `numel` of its
// input (a contiguous input keeps them, in order, at the start of a contiguous output),
// and only the shape and dtype of the rest, or of all when a layout is not contiguous.
// (PyTorch's functionalization test `test_resize_larger` grows a view so.) The number
// compared, or nullopt when `op` does
// not grow its input.
std::optional<int64_t> ElementsKeptByResize(const Op& op, const std::vector<at::Tensor>& saved,
                                            const at::Tensor& output, const at::Tensor& replayed) {
  if ((op.func_name != "aten::resize_" && op.func_name != "aten::resize_as_") || saved.empty() ||
      !saved[0].defined() || !output.defined() || output.numel() <= saved[0].numel()) {
    return std::nullopt;
  }
  const at::Tensor& input = saved[0];
  return input.is_contiguous() && output.is_contiguous() && replayed.is_contiguous() ? input.numel()
                                                                                     : 0;
}

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

// NOTE [Validating on several threads]
// Every op is checked from its own saved values, so ops can be checked in any order and on
// any thread. Each thread runs a Validator that takes the next unchecked op from a shared
// counter until none is left (ops differ in cost by orders of magnitude, a convolution
// against a view, so a fixed split leaves one thread idle); each op's perturbations draw
// from a generator seeded with the op's position, so the report does not depend on the
// thread count or on which thread checked which op. Lines are tagged with
// the position of the op they are about and merged in trace order. Buffer versions are
// checked afterwards, on one thread, from what the ops' checks established.
class Validator {
 public:
  using Lines = std::vector<std::pair<int, std::string>>;  // (op position, line)

  explicit Validator(const Trace& trace)
      : trace_(trace), generator_(at::make_generator<at::CPUGeneratorImpl>(kSeed)) {}

  // Checks ops and outputs, each at the position `next` hands out, until it passes the
  // end; `next` is shared by the threads validating the same trace.
  void CheckOps(std::atomic<size_t>* next) {
    // Replay must not be captured, also on worker threads (the key set is thread-local).
    c10::impl::ExcludeDispatchKeyGuard not_captured(kCaptureKey);
    const std::vector<Op>& ops = trace_.ops();
    for (size_t i = next->fetch_add(1, std::memory_order_relaxed); i < ops.size();
         i = next->fetch_add(1, std::memory_order_relaxed)) {
      const Op& op = ops[i];
      position_ = i;
      seeded_ = false;
      // Whatever throws while an op is checked is a verdict on that op, never an exception
      // out of validation (NOTE [Checks that throw]).
      try {
        // NOTE [Arguments a trace file cannot hold]: such an op has nothing to re-run.
        if (op.is_compute() && (!op.saved() || ArgumentsNotKept(op))) {
          Note(&not_checked_, op, op.label);
        } else if (op.is_compute()) {
          CheckOp(op);
        } else if (op.is_output()) {
          CheckOutput(op);
        }
      } catch (const std::exception& e) {
        // NOTE [Checks that throw]
        // An exception out of validation's own checking (a conversion a value does not
        // allow, a kernel that rejects what a check built) says nothing about the trace:
        // the op is unproved, with the reason, as an edge no perturbation changes is. A
        // failure needs evidence against the trace (a value that differs, a wrong parent),
        // never the absence of a check.
        Note(&unproved_, op, absl::StrCat(op.label, ": not checkable: ", FirstLine(e)));
      }
    }
  }

  // Takes in what `other` found (NOTE [Validating on several threads]).
  void Merge(Validator&& other) {
    for (Lines Validator::*lines : {&Validator::failures_, &Validator::unproved_,
                                    &Validator::state_transition_only_, &Validator::not_checked_}) {
      (this->*lines).insert((this->*lines).end(), (other.*lines).begin(), (other.*lines).end());
    }
    fused_checked_.insert(other.fused_checked_.begin(), other.fused_checked_.end());
    ops_checked_ += other.ops_checked_;
    perturbations_checked_ += other.perturbations_checked_;
  }

  // Checks the buffer versions and lists the dead nodes; the report in trace order.
  ValidationReport Finish() {
    for (const Op& op : trace_.ops()) {
      if (!op.is_buffer) continue;
      try {
        CheckBufferVersion(op);
      } catch (const std::exception& e) {
        // See NOTE [Checks that throw].
        Note(&unproved_, op, absl::StrCat(op.label, ": not checkable: ", FirstLine(e)));
      }
    }
    ValidationReport report;
    report.failures = Ordered(&failures_);
    report.unproved = Ordered(&unproved_);
    report.state_transition_only = Ordered(&state_transition_only_);
    report.not_checked = Ordered(&not_checked_);
    for (int index : DeadNodes(trace_)) report.dead.push_back(trace_.ops()[index].label);
    for (int index : CutOffNodes(trace_)) report.cut_off.push_back(trace_.ops()[index].label);
    report.ops_checked = ops_checked_;
    report.perturbations_checked = perturbations_checked_;
    report.passed = report.failures.empty();
    return report;
  }

 private:
  static constexpr uint64_t kSeed = 20240601;

  static std::vector<std::string> Ordered(Lines* lines) {
    std::stable_sort(lines->begin(), lines->end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    // One line per fact: an op with several alias writes replay cannot redo is listed once.
    std::vector<std::string> ordered;
    ordered.reserve(lines->size());
    size_t group = 0;  // first line of the current position
    for (size_t i = 0; i < lines->size(); ++i) {
      auto& [position, line] = (*lines)[i];
      if (i > 0 && position != (*lines)[i - 1].first) group = ordered.size();
      if (std::find(ordered.begin() + group, ordered.end(), line) != ordered.end()) continue;
      ordered.push_back(std::move(line));
    }
    return ordered;
  }

  void Note(Lines* lines, const Op& op, std::string line) {
    lines->emplace_back(trace_.IndexOf(&op), std::move(line));
  }
  const Op* Node(absl::string_view label) const {
    const int index = trace_.IndexOfLabel(label);
    return index < 0 ? nullptr : &trace_.ops()[index];
  }
  // Whether `source` names an op whose values the capture did not save.
  // Whether the value `source` names was not saved by a partly saved capture: its op's
  // values, or the value after one of its alias writes, which the capture saves only when it
  // saved the written tensor's value before (NOTE [Dead views are written too] in
  // torchlens_dispatch/saved_value_index.h).
  bool Unsaved(const ArgSource& source) const {
    const Op* node = source.kind == ArgSource::Kind::kNode ? Node(source.name) : nullptr;
    if (node == nullptr || !node->is_compute()) return false;
    return !node->saved() ||
           (source.output_index < 0 && !OutputValue(*node, source.output_index).defined());
  }

  void Fail(const Op& op, absl::string_view why) {
    Note(&failures_, op, absl::StrCat(op.label, ": ", why));
  }

  // The saved tensors inside op.creation_args, in ForEachTensor order.
  static std::vector<at::Tensor> SavedArguments(const Op& op) {
    std::vector<at::Tensor> tensors;
    tensors.reserve(op.arg_sources.size());
    for (const c10::IValue& arg : op.creation_args) {
      ForEachTensor(arg, [&](const at::Tensor& t) { tensors.push_back(t); });
    }
    return tensors;
  }

  static std::vector<c10::IValue> PlainArguments(const Op& op) {
    return ReplayArguments(op,
                           [](int, const ArgSource&, const at::Tensor& value) { return value; });
  }

  NodeLookup Lookup() const {
    return [this](absl::string_view label) { return Node(label); };
  }

  // The value of `source` in this trace, or nullopt naming why there is none.
  const at::Tensor* SourceValue(const ArgSource& source) const {
    const Op* node = Node(source.name);
    if (node == nullptr) return nullptr;
    return &OutputValue(*node, source.output_index);
  }

  void CheckOp(const Op& op) {
    ++ops_checked_;
    // Edges: the parents are the argument sources, then the earlier values of the tensors
    // the op changed through aliases; each argument is its parent's value.
    absl::InlinedVector<absl::string_view, 4> expected_parents;  // views of op's labels
    auto add_parent = [&](absl::string_view label) {
      if (std::find(expected_parents.begin(), expected_parents.end(), label) ==
          expected_parents.end()) {
        expected_parents.push_back(label);
      }
    };
    for (const ArgSource& source : op.arg_sources) {
      if (source.kind == ArgSource::Kind::kNode) add_parent(source.name);
    }
    for (const AliasWrite& write : op.alias_writes) {
      if (write.before.kind == ArgSource::Kind::kNode) add_parent(write.before.name);
    }
    if (!std::equal(expected_parents.begin(), expected_parents.end(), op.parents.begin(),
                    op.parents.end())) {
      Fail(op, absl::StrCat("wrong parents: the graph names [", absl::StrJoin(op.parents, ", "),
                            "] but the arguments came from [",
                            absl::StrJoin(expected_parents, ", "), "]"));
    }
    const std::vector<at::Tensor> saved = SavedArguments(op);
    for (size_t i = 0; i < op.arg_sources.size() && i < saved.size(); ++i) {
      const ArgSource& source = op.arg_sources[i];
      if (source.kind != ArgSource::Kind::kNode) continue;
      const at::Tensor* parent_value = SourceValue(source);
      if (parent_value == nullptr) {
        Fail(op, absl::StrCat("wrong parent: argument ", i, " names unknown node ", source.name));
        continue;
      }
      if (Unsaved(source)) continue;  // the argument was saved, its producer's value not
      if (parent_value->defined() &&
          saved[i].unsafeGetTensorImpl() == parent_value->unsafeGetTensorImpl()) {
        continue;
      }
      if (std::optional<std::string> diff = Difference(saved[i], *parent_value)) {
        Fail(op, absl::StrCat(
                     "wrong parent: argument ", i, " is not the saved ",
                     source.output_index < 0 ? "value after the alias write of " : "output of ",
                     source.name, " (", *diff, ")"));
      }
    }

    // Replay.
    absl::StatusOr<ReplayResult> replay = ReplayOp(op, PlainArguments(op));
    if (!replay.ok()) {
      // Arguments a kernel would trust are not passed to it: unproved, as the verdict on a
      // file that makes them up (NOTE [Kernels that trust their arguments]).
      if (IsKernelPreconditionRefusal(replay.status())) {
        Note(&unproved_, op, std::string(replay.status().message()));
        return;
      }
      // A copy may not hold the bytes the capture read (NOTE [Replays of as_strided]).
      if (const absl::string_view why = NotReproducible(op.func_name, Arguments(op));
          !why.empty()) {
        Note(&unproved_, op,
             absl::StrCat(op.label, ": ", replay.status().message(), " (", why, ")"));
        return;
      }
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
      const std::optional<int64_t> kept = ElementsKeptByResize(op, saved, expected, actual);
      if (Uninitialized(op.func_name) || kept.has_value()) {
        if (actual.sizes() != expected.sizes() || actual.scalar_type() != expected.scalar_type()) {
          Fail(op, absl::StrCat("output ", k, " has another shape or dtype than captured"));
        } else if (kept.value_or(0) > 0) {
          // See NOTE [Elements a resize leaves uninitialized].
          if (std::optional<std::string> diff =
                  Difference(actual.reshape(-1).narrow(0, 0, *kept),
                             expected.reshape(-1).narrow(0, 0, *kept))) {
            Fail(op, absl::StrCat("value mismatch on output ", k,
                                  " in the elements it had before the resize (", *diff, ")"));
          }
        }
        continue;
      }
      if (std::optional<std::string> diff = Difference(actual, expected)) {
        // See NOTE [Kernels that read memory they never initialized].
        const absl::string_view why = NotReproducible(op.func_name, Arguments(op));
        if (why.empty() && ReadsWhatItWrites(op)) {
          Note(&unproved_, op,
               absl::StrCat(op.label, ": output ", k, " differs (", *diff,
                            "): ", kReadsWhatItWrites));
        } else if (why.empty()) {
          Fail(op, absl::StrCat("value mismatch on output ", k, " (", *diff, ")"));
        } else if (!CloseUpToRounding(actual, expected)) {
          Note(&unproved_, op,
               absl::StrCat(op.label, ": output ", k, " is not reproducible (", *diff, "): ", why));
        }
      }
    }
    CheckAliasWrites(op);
    CheckFusedTransitions(op, *replay);
    if (!Uninitialized(op.func_name)) CheckPerturbations(op, saved, *replay);
  }

  // NOTE [Writes through aliases]: each tensor the op changed through an alias must be
  // what redoing the write on its earlier value gives.
  void CheckAliasWrites(const Op& op) {
    // Computed once, for the first write that is not one argument's.
    std::optional<absl::StatusOr<FusedWriteRedone>> redone;
    for (size_t k = 0; k < op.alias_writes.size(); ++k) {
      const AliasWrite& write = op.alias_writes[k];
      const at::Tensor* before = SourceValue(write.before);
      const Op* changed = BufferChangedBy(op, -static_cast<int>(k) - 1);
      const std::string& name = changed != nullptr ? changed->label : write.before.name;
      if (before == nullptr) {
        Fail(op, absl::StrCat("alias write ", k, " names unknown node ", write.before.name));
        continue;
      }
      if (Unsaved(write.before) || !write.value.defined()) {
        Note(&not_checked_, changed != nullptr ? *changed : op, name);
        continue;
      }
      absl::StatusOr<at::Tensor> after = ReplayAliasWrite(op, write, PlainArguments(op), *before);
      const Op* changed_view = Node(write.before.name);
      if (!after.ok() && write.written_tensor < 0 && changed_view != nullptr) {
        // See NOTE [Fused writes through views].
        if (!redone.has_value()) redone = RedoFusedWriteThroughViews(op, Lookup());
        if (redone->ok()) {
          after = ViewAfterFusedWrite(*changed_view, write.before.output_index, **redone, Lookup());
        }
      }
      if (!after.ok()) {
        // A write that replay cannot redo is a state transition it cannot prove.
        Note(&state_transition_only_, op, changed != nullptr ? changed->label : op.label);
        continue;
      }
      if (std::optional<std::string> diff = Difference(*after, write.value)) {
        if (ReadsWhatItWrites(op)) {
          Note(&unproved_, changed != nullptr ? *changed : op,
               absl::StrCat(name, ": the value ", op.label, " wrote through an alias differs (",
                            *diff, "): ", kReadsWhatItWrites));
          continue;
        }
        Fail(changed != nullptr ? *changed : op,
             absl::StrCat("the value written through an alias by ", op.label, " into ", name,
                          " differs from redoing the write on ", write.before.name, " (", *diff,
                          ")"));
      }
    }
  }

  // NOTE [Ops that read what they write]
  // An op whose written tensor overlaps another of its arguments (`torch.add(b[0], b[:, 0],
  // out=b[3])`: the column's last element is the row's first) reads, for some elements, what it
  // already wrote, so its result depends on the order its kernel visits them in. PyTorch refuses
  // such calls when it can tell (contiguous partial overlap) and runs the others. Replay reads the
  // saved arguments, the values before the call, so it cannot reproduce the result: a difference is
  // unproved, not failed. The capture shows the overlap as an alias write whose earlier
  // value is one of the op's own arguments that it does not write itself. Writes that are
  // not one argument's (a fused mutator's state, a nested kernel's) are not judged.
  static constexpr absl::string_view kReadsWhatItWrites =
      "the op reads, through another argument, memory it writes, so its result depends on "
      "the order its kernel visits the elements in, which replay from the saved arguments "
      "cannot reproduce (NOTE [Ops that read what they write])";
  static bool ReadsWhatItWrites(const Op& op) {
    std::optional<std::vector<int>> outs;  // computed for the first write that needs them
    for (const AliasWrite& write : op.alias_writes) {
      if (write.written_tensor < 0) continue;
      for (size_t j = 0; j < op.arg_sources.size(); ++j) {
        const ArgSource& source = op.arg_sources[j];
        if (static_cast<int>(j) == write.written_tensor) continue;
        if (!outs.has_value()) outs = OutTensors(op);
        if (std::find(outs->begin(), outs->end(), static_cast<int>(j)) != outs->end()) continue;
        if (source.kind == write.before.kind && source.name == write.before.name &&
            source.output_index == write.before.output_index) {
          return true;
        }
      }
    }
    return false;
  }

  // The buffer version whose source is output `output_index` of `op`, if any.
  const Op* BufferChangedBy(const Op& op, int output_index) const {
    for (int32_t child : op.child_indices) {
      const Op* version = child < 0 ? nullptr : &trace_.ops()[child];
      if (version != nullptr && version->is_buffer && !version->arg_sources.empty() &&
          version->arg_sources[0].name == op.label &&
          version->arg_sources[0].output_index == output_index) {
        return version;
      }
    }
    return nullptr;
  }

  // NOTE [Fused buffer writes]: the re-run from the previous version's state must produce
  // the captured version.
  void CheckFusedTransitions(const Op& op, const ReplayResult& replay) {
    for (const auto& [argument, after] : replay.state_after) {
      const FusedStateVersions versions = FindFusedStateVersions(
          op, argument, [this](absl::string_view label) { return Node(label); });
      if (versions.previous == nullptr) continue;  // not a registered buffer
      if (versions.written == nullptr) {
        Fail(op, absl::StrCat("updated ", versions.previous->address, " (", op.func_name,
                              ") but the trace has no fused version for it"));
        continue;
      }
      fused_checked_.insert(versions.written);
      if (std::optional<std::string> diff = Difference(after, versions.written->out)) {
        Fail(*versions.written,
             absl::StrCat("fused write of ", versions.written->address, " differs from re-running ",
                          op.label, " from ", versions.previous->label, " (", *diff, ")"));
      }
    }
  }

  // `saved`: the op's saved tensor arguments (SavedArguments).
  void CheckPerturbations(const Op& op, const std::vector<at::Tensor>& saved,
                          const ReplayResult& unperturbed) {
    // An op whose tensor outputs are all empty has no value a parent could change.
    if (!unperturbed.outputs.empty() &&
        std::all_of(unperturbed.outputs.begin(), unperturbed.outputs.end(),
                    [](const at::Tensor& t) { return t.defined() && t.numel() == 0; })) {
      return;
    }
    const std::vector<std::vector<int>> perturbed_tensors = PerturbedTensorsByParent(op);
    const std::optional<Corner> corner = FindCorner(op);
    for (size_t p = 0; p < op.parents.size(); ++p) {
      const std::string& parent = op.parents[p];
      // The tensor arguments that come from this parent and can matter.
      const std::vector<int>& indexes = perturbed_tensors[p];
      if (indexes.empty()) continue;
      bool empty = true;
      std::string unperturbable;
      for (int i : indexes) {
        if (i >= static_cast<int>(saved.size())) continue;
        const at::Tensor& value = saved[i];
        empty = empty && value.numel() == 0;
        if (value.layout() != at::kStrided || value.is_meta() ||
            (value.is_quantized() && value.qscheme() != at::kPerTensorAffine &&
             value.qscheme() != at::kPerChannelAffine &&
             value.qscheme() != at::kPerChannelAffineFloatQParams)) {
          unperturbable = value.is_quantized() ? "quantized" : value.is_meta() ? "meta" : "sparse";
        }
      }
      if (empty) continue;
      // A product's other factor that is all zeros (stochastic depth's dropped block,
      // ZeroedByAnotherArgument) exempts the edge. Scanning that factor costs kernels, so
      // it is asked only when the first perturbation did not prove the edge. Either way
      // the edge is no failure; one the first perturbation changed is counted as proved
      // (times zero it can still flip the sign of a zero, which bitwise equality sees).
      const auto zeroed = [&] { return ZeroedByAnotherArgument(op.func_name, saved, indexes); };
      if (!unperturbable.empty()) {
        if (zeroed()) continue;
        Note(&unproved_, op,
             absl::StrCat(op.label, " <- ", parent, ": ", unperturbable,
                          " values cannot be perturbed"));
        continue;
      }
      // Seeded on first use (most ops need no random perturbation): NOTE [Validating on
      // several threads].
      const auto generator = [this]() -> at::Generator& {
        if (!seeded_) {
          generator_.set_current_seed(kSeed + position_);
          seeded_ = true;
        }
        return generator_;
      };
      // NOTE [Perturbing a corner]: proved on a corner of the input when it can be.
      std::optional<std::vector<c10::IValue>> pair;
      if (corner.has_value()) {
        pair = CornerPairArguments(op, *corner, indexes, [&](const at::Tensor& value) {
          return Perturbation(value, 0, generator);
        });
      }
      if (pair.has_value()) {
        absl::StatusOr<ReplayResult> run = ReplayOp(op, *std::move(pair));
        if (run.ok() && PairSamplesDiffer(*corner, run->outputs)) {
          ++perturbations_checked_;
          continue;
        }
      }
      bool reacted = false;
      bool exempt = false;
      for (int attempt = 0; !reacted; ++attempt) {
        if (attempt == 1 && zeroed()) {
          exempt = true;
          break;
        }
        std::vector<c10::IValue> args;
        bool exhausted = false;
        args = ReplayArguments(op, [&](int index, const ArgSource&, const at::Tensor& value) {
          if (exhausted || std::find(indexes.begin(), indexes.end(), index) == indexes.end()) {
            return value;
          }
          std::optional<at::Tensor> perturbed = Perturbation(value, attempt, generator);
          if (!perturbed.has_value()) {
            exhausted = true;
            return value;
          }
          return *perturbed;
        });
        if (exhausted) break;
        absl::StatusOr<ReplayResult> perturbed = ReplayOp(op, std::move(args));
        // An op that rejects the perturbed value depends on it too.
        reacted = !perturbed.ok() || !SameReturns(*perturbed, unperturbed);
      }
      if (exempt) continue;
      if (reacted) {
        ++perturbations_checked_;
      } else if (DataDependentlyExempt(op.func_name, Arguments(op), saved, indexes,
                                       unperturbed.outputs)) {
        // See NOTE [Data-dependent exemptions].
      } else {
        // See NOTE [Perturbations that can prove]: unproved, with the reason, never failed.
        const bool finite = std::all_of(indexes.begin(), indexes.end(), [&](int i) {
          return i >= static_cast<int>(saved.size()) || AllFinite(saved[i]);
        });
        Note(&unproved_, op,
             absl::StrCat(op.label, " <- ", parent, ": no perturbation tried changes the output (",
                          !finite ? "the parent holds NaN or infinite values"
                          : NonFiniteEverywhere(unperturbed.outputs)
                              ? "the output is NaN or infinite everywhere, which another "
                                "argument decides whatever this parent holds"
                          : Predicate(op.func_name, unperturbed.outputs) ? "the op is a predicate"
                          : std::all_of(indexes.begin(), indexes.end(),
                                        [&](int i) { return SometimesDecisive(op.func_name, i); })
                              ? "the parent decides the output only for some values"
                              : "for these values the op does not depend on this parent",
                          ")"));
      }
    }
  }

  void CheckOutput(const Op& op) {
    ++ops_checked_;
    if (op.parents.size() != 1) {
      Fail(op, absl::StrCat("an output needs exactly one parent, has ", op.parents.size()));
      return;
    }
    const Op* parent = Node(op.parents[0]);
    if (parent == nullptr) {
      Fail(op, absl::StrCat("wrong parent: unknown node ", op.parents[0]));
      return;
    }
    if (parent->is_compute() && !parent->saved()) {
      --ops_checked_;
      Note(&not_checked_, op, op.label);
      return;
    }
    std::vector<at::Tensor> candidates;
    if (!op.arg_sources.empty()) {
      candidates.push_back(OutputValue(*parent, op.arg_sources[0].output_index));
    } else {
      candidates = parent->outs.ToVector();
      if (candidates.empty()) candidates.push_back(parent->out);
    }
    for (const at::Tensor& candidate : candidates) {
      if (!Difference(op.out, candidate).has_value()) return;
    }
    Fail(op, absl::StrCat("wrong parent: the output is not the saved value of ", parent->label,
                          " it names"));
  }

  void CheckBufferVersion(const Op& version) {
    auto buffer = trace_.buffers().find(version.address);
    if (buffer == trace_.buffers().end()) {
      Fail(version, absl::StrCat("names unknown buffer ", version.address));
      return;
    }
    if (!version.buffer_write_kind.has_value()) {
      // See NOTE [Independent initial values].
      ++ops_checked_;
      if (std::optional<std::string> diff = Difference(version.out, buffer->second.initial_value)) {
        Fail(version, absl::StrCat("a read of the initial value of ", version.address,
                                   " differs from it (", *diff, ")"));
      }
      return;
    }
    if (fused_checked_.contains(&version)) {
      ++ops_checked_;
      return;
    }
    const Op* producer = version.parents.empty() ? nullptr : Node(version.parents[0]);
    if (producer != nullptr && producer->is_compute() && !producer->saved()) {
      Note(&not_checked_, version, version.label);
      return;
    }
    if (producer == nullptr) {
      // A reassignment from outside the capture: nothing to compare with.
      if (version.buffer_write_kind == WriteKind::kReassign) {
        Note(&state_transition_only_, version, version.label);
      } else {
        Fail(version, "a write without a producer");
      }
      return;
    }
    if (version.buffer_write_kind == WriteKind::kFused) {
      // See NOTE [Fused writes through views].
      absl::StatusOr<FusedWriteRedone> redone = RedoFusedWriteThroughViews(*producer, Lookup());
      const at::Tensor* after = redone.ok() ? redone->After(version.address) : nullptr;
      if (after != nullptr) {
        if (std::optional<std::string> diff = Difference(*after, version.out)) {
          Fail(version,
               absl::StrCat("fused write of ", version.address,
                            " through views of it differs from re-running ", producer->label,
                            " on the same views of a copy (", *diff, ")"));
          return;
        }
        ++ops_checked_;
        return;
      }
      // Written inside a kernel that is not a known fused mutator: nothing re-runs it.
      Note(&state_transition_only_, version, version.label);
      return;
    }
    const int output = version.arg_sources.empty() ? 0 : version.arg_sources[0].output_index;
    if (output < 0) {
      const size_t k = static_cast<size_t>(-(output + 1));
      if (k >= producer->alias_writes.size()) {
        Fail(version, absl::StrCat("names alias write ", k, " of ", producer->label, ", which has ",
                                   producer->alias_writes.size()));
        return;
      }
      if (producer->alias_writes[k].written_tensor < 0) return;  // listed by CheckAliasWrites
    }
    const at::Tensor& written = OutputValue(*producer, output);
    if (std::optional<std::string> diff = Difference(version.out, written)) {
      Fail(version, absl::StrCat("the written value of ", version.address, " is not ",
                                 output < 0 ? "what " : "the output of ", producer->label,
                                 output < 0 ? " wrote through an alias" : "", " (", *diff, ")"));
      return;
    }
    ++ops_checked_;
  }

  const Trace& trace_;
  at::Generator generator_;
  size_t position_ = 0;  // of the op being checked
  bool seeded_ = false;  // generator_ seeded for it
  absl::flat_hash_set<const Op*> fused_checked_;
  Lines failures_;
  Lines unproved_;
  Lines state_transition_only_;
  Lines not_checked_;
  int ops_checked_ = 0;
  int perturbations_checked_ = 0;
};

}  // namespace

absl::StatusOr<ValidationReport> ValidateForwardPass(const Trace& trace) {
  return ValidateForwardPass(trace, ValidationOptions());
}

absl::StatusOr<ValidationReport> ValidateForwardPass(const Trace& trace,
                                                     const ValidationOptions& options) {
  if (absl::Status saved = RequireSavedValues(trace, "validate it"); !saved.ok()) return saved;
  if (options.threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("ValidationOptions::threads is ", options.threads, "; give 1 or more"));
  }
  c10::impl::ExcludeDispatchKeyGuard not_captured(kCaptureKey);
  // See NOTE [Validating on several threads].
  const size_t threads = std::min<size_t>(options.threads, std::max<size_t>(trace.ops().size(), 1));
  std::vector<Validator> workers;
  workers.reserve(threads);
  for (size_t t = 0; t < threads; ++t) workers.emplace_back(trace);
  std::atomic<size_t> next{0};  // the position of the next op to check
  std::vector<std::thread> running;
  for (size_t t = 1; t < threads; ++t) {
    running.emplace_back([&workers, &next, t] { workers[t].CheckOps(&next); });
  }
  workers[0].CheckOps(&next);
  for (std::thread& thread : running) thread.join();
  for (size_t t = 1; t < threads; ++t) workers[0].Merge(std::move(workers[t]));
  return workers[0].Finish();
}

std::string ValidationReportToJson(const ValidationReport& report) {
  nlohmann::ordered_json json;
  json["passed"] = report.passed;
  json["ops_checked"] = report.ops_checked;
  json["failures"] = report.failures;
  json["dead"] = report.dead;
  json["state_transition_only"] = report.state_transition_only;
  json["perturbations_checked"] = report.perturbations_checked;
  json["unproved"] = report.unproved;
  json["not_checked"] = report.not_checked;
  json["cut_off"] = report.cut_off;
  // Labels read from a file may not be UTF-8: replaced (U+FFFD), never thrown.
  return json.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace torchlens
