#include "validation/op_checks.h"

#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <algorithm>
#include <atomic>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "graph/release_after_last_use.h"
#include "torchlens_dispatch/ops/bit_identical.h"
#include "torchlens_dispatch/ops/capture_key.h"
#include "torchlens_dispatch/ops/exception_text.h"
#include "torchlens_dispatch/ops/exemptions.h"
#include "torchlens_dispatch/ops/ivalue_tensors.h"
#include "validation/fused_views.h"
#include "validation/kernel_preconditions.h"
#include "validation/op_arguments.h"
#include "validation/perturbation_check.h"
#include "validation/replay.h"
#include "validation/values.h"
#include "validation/verdicts.h"

namespace torchlens {
namespace {

// NOTE [Elements a resize leaves uninitialized]
// `resize_` and `resize_as_` growing a tensor past the elements it had leave the new ones
// uninitialized, as `empty` does: its saved value and its replay each hold whatever memory
// they got there. Replay compares the elements the tensor had, the first `numel` of its
// input (a contiguous input keeps them, in order, at the start of a contiguous output),
// and only the shape and dtype of the rest, or of all when a layout is not contiguous.
// (PyTorch's functionalization test `test_resize_larger` grows a view so.) The number
// compared, or nullopt when `op` does not grow its input.
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

// One thread's checker (NOTE [Validating on several threads] in op_checks.h).
class OpChecker {
 public:
  explicit OpChecker(const Trace& trace)
      : trace_(trace), generator_(at::make_generator<at::CPUGeneratorImpl>(kSeed)) {}

  // Checks ops and outputs, each at the position `next` hands out, until it passes the
  // end; `next` is shared by the threads validating the same trace.
  void CheckOps(std::atomic<size_t>* next, ReleaseAfterLastUse* pages) {
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
          Note(&verdicts_.not_checked, op, op.label);
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
        Note(&verdicts_.unproved, op, absl::StrCat(op.label, ": not checkable: ", FirstLine(e)));
      }
      pages->Done(i);
    }
  }

  // Takes in what `other` found (NOTE [Validating on several threads]).
  void Merge(OpChecker&& other) {
    verdicts_.Merge(std::move(other.verdicts_));
    fused_checked_.insert(other.fused_checked_.begin(), other.fused_checked_.end());
  }

  // Checks the buffer versions and lists the dead nodes; the report in trace order.
  ValidationReport Finish() {
    for (const Op& op : trace_.ops()) {
      if (!op.is_buffer_version()) continue;
      try {
        CheckBufferVersion(op);
      } catch (const std::exception& e) {
        // See NOTE [Checks that throw].
        Note(&verdicts_.unproved, op, absl::StrCat(op.label, ": not checkable: ", FirstLine(e)));
      }
    }
    return ReportOf(trace_, std::move(verdicts_));
  }

 private:
  static constexpr uint64_t kSeed = 20240601;

  void Note(Verdicts::Lines* lines, const Op& op, std::string line) {
    lines->emplace_back(trace_.IndexOf(&op), std::move(line));
  }
  // Whether `source` names an op whose values the capture did not save.
  // Whether the value `source` names was not saved by a partly saved capture: its op's
  // values, or the value after one of its alias writes, which the capture saves only when it
  // saved the written tensor's value before (NOTE [Dead views are written too] in
  // torchlens_dispatch/saved_value_index.h).
  bool Unsaved(const ArgSource& source) const {
    const Op* node = SourceNode(trace_.ops(), source);
    if (node == nullptr || !node->is_compute()) return false;
    return !node->saved() ||
           (source.output_index < 0 && !OutputValue(*node, source.output_index).defined());
  }

  void Fail(const Op& op, absl::string_view why) {
    Note(&verdicts_.failures, op, absl::StrCat(op.label, ": ", why));
  }

  // The saved tensors inside op.creation_args, in ForEachTensor order.
  static std::vector<at::Tensor> SavedTensorArguments(const Op& op) {
    std::vector<at::Tensor> tensors;
    tensors.reserve(op.arg_sources.size());
    for (const c10::IValue& arg : op.creation_args) {
      ForEachTensor(arg, [&](const at::Tensor& t) { tensors.push_back(t); });
    }
    return tensors;
  }

  // The value of `source` in this trace, or null when it names no node.
  const at::Tensor* SourceValue(const ArgSource& source) const {
    const Op* node = SourceNode(trace_.ops(), source);
    if (node == nullptr) return nullptr;
    return &OutputValue(*node, source.output_index);
  }

  void CheckOp(const Op& op) {
    ++verdicts_.ops_checked;
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
    const std::vector<at::Tensor> saved = SavedTensorArguments(op);
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
    absl::StatusOr<ReplayResult> replay = ReplayOp(op, CapturedArguments(op));
    if (!replay.ok()) {
      // Arguments a kernel would trust are not passed to it: unproved, as the verdict on a
      // file that makes them up (NOTE [Kernels that trust their arguments]).
      if (IsKernelPreconditionRefusal(replay.status())) {
        Note(&verdicts_.unproved, op, std::string(replay.status().message()));
        return;
      }
      // A copy may not hold the bytes the capture read (NOTE [Replays of as_strided]).
      if (const absl::string_view why = NotReproducible(op.func_name, ArgumentsOf(op));
          !why.empty()) {
        Note(&verdicts_.unproved, op,
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
        const absl::string_view why = NotReproducible(op.func_name, ArgumentsOf(op));
        if (why.empty() && ReadsWhatItWrites(op)) {
          Note(&verdicts_.unproved, op,
               absl::StrCat(op.label, ": output ", k, " differs (", *diff,
                            "): ", kReadsWhatItWrites));
        } else if (why.empty()) {
          Fail(op, absl::StrCat("value mismatch on output ", k, " (", *diff, ")"));
        } else if (!CloseUpToRounding(actual, expected)) {
          Note(&verdicts_.unproved, op,
               absl::StrCat(op.label, ": output ", k, " is not reproducible (", *diff, "): ", why));
        }
      }
    }
    CheckAliasWrites(op);
    CheckFusedTransitions(op, *replay);
    if (Uninitialized(op.func_name)) return;
    // Seeded on first use (most ops need no random perturbation): NOTE [Validating on
    // several threads].
    EdgeVerdicts edges = CheckPerturbations(op, saved, *replay, [this]() -> at::Generator& {
      if (!seeded_) {
        generator_.set_current_seed(kSeed + position_);
        seeded_ = true;
      }
      return generator_;
    });
    verdicts_.perturbations_checked += edges.proved;
    for (std::string& line : edges.unproved) Note(&verdicts_.unproved, op, std::move(line));
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
        Note(&verdicts_.not_checked, changed != nullptr ? *changed : op, name);
        continue;
      }
      absl::StatusOr<at::Tensor> after =
          RedoAliasWrite(op, write, CapturedArguments(op), before, trace_.ops(), [&] {
            if (!redone.has_value()) redone = RedoFusedWriteThroughViews(op, trace_.ops());
            return redone->ok() ? &**redone : nullptr;
          });
      if (!after.ok()) {
        // A write that replay cannot redo is a state transition it cannot prove.
        Note(&verdicts_.state_transition_only, op, changed != nullptr ? changed->label : op.label);
        continue;
      }
      if (std::optional<std::string> diff = Difference(*after, write.value)) {
        if (ReadsWhatItWrites(op)) {
          Note(&verdicts_.unproved, changed != nullptr ? *changed : op,
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
        if (SameSource(source, write.before)) return true;
      }
    }
    return false;
  }

  // The buffer version whose source is output `output_index` of `op`, if any.
  const Op* BufferChangedBy(const Op& op, int output_index) const {
    for (int32_t child : op.child_indices) {
      const Op* version = child < 0 ? nullptr : &trace_.ops()[child];
      if (version != nullptr && version->is_buffer_version() && !version->arg_sources.empty() &&
          SourceNode(trace_.ops(), version->arg_sources[0]) == &op &&
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
      const FusedStateVersions versions = FindFusedStateVersions(op, argument, trace_.ops());
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

  void CheckOutput(const Op& op) {
    ++verdicts_.ops_checked;
    if (op.parents.size() != 1) {
      Fail(op, absl::StrCat("an output needs exactly one parent, has ", op.parents.size()));
      return;
    }
    const Op* parent = op.parent_indices[0] < 0 ? nullptr : &trace_.ops()[op.parent_indices[0]];
    if (parent == nullptr) {
      Fail(op, absl::StrCat("wrong parent: unknown node ", op.parents[0]));
      return;
    }
    if (parent->is_compute() && !parent->saved()) {
      --verdicts_.ops_checked;
      Note(&verdicts_.not_checked, op, op.label);
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
      ++verdicts_.ops_checked;
      if (std::optional<std::string> diff = Difference(version.out, buffer->second.initial_value)) {
        Fail(version, absl::StrCat("a read of the initial value of ", version.address,
                                   " differs from it (", *diff, ")"));
      }
      return;
    }
    if (fused_checked_.contains(&version)) {
      ++verdicts_.ops_checked;
      return;
    }
    const Op* producer = version.parent_indices.empty() || version.parent_indices[0] < 0
                             ? nullptr
                             : &trace_.ops()[version.parent_indices[0]];
    if (producer != nullptr && producer->is_compute() && !producer->saved()) {
      Note(&verdicts_.not_checked, version, version.label);
      return;
    }
    if (producer == nullptr) {
      // A reassignment from outside the capture: nothing to compare with.
      if (version.buffer_write_kind == WriteKind::kReassign) {
        Note(&verdicts_.state_transition_only, version, version.label);
      } else {
        Fail(version, "a write without a producer");
      }
      return;
    }
    if (version.buffer_write_kind == WriteKind::kFused) {
      // See NOTE [Fused writes through views].
      absl::StatusOr<FusedWriteRedone> redone = RedoFusedWriteThroughViews(*producer, trace_.ops());
      const at::Tensor* after = redone.ok() ? redone->After(version.address) : nullptr;
      if (after != nullptr) {
        if (std::optional<std::string> diff = Difference(*after, version.out)) {
          Fail(version,
               absl::StrCat("fused write of ", version.address,
                            " through views of it differs from re-running ", producer->label,
                            " on the same views of a copy (", *diff, ")"));
          return;
        }
        ++verdicts_.ops_checked;
        return;
      }
      // Written inside a kernel that is not a known fused mutator: nothing re-runs it.
      Note(&verdicts_.state_transition_only, version, version.label);
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
    ++verdicts_.ops_checked;
  }

  const Trace& trace_;
  at::Generator generator_;
  size_t position_ = 0;  // of the op being checked
  bool seeded_ = false;  // generator_ seeded for it
  absl::flat_hash_set<const Op*> fused_checked_;
  Verdicts verdicts_;
};

}  // namespace

ValidationReport CheckTrace(const Trace& trace, size_t threads) {
  // See NOTE [Validating on several threads].
  threads = std::max<size_t>(1, std::min<size_t>(threads, trace.ops().size()));
  std::vector<OpChecker> workers;
  workers.reserve(threads);
  for (size_t t = 0; t < threads; ++t) workers.emplace_back(trace);
  std::atomic<size_t> next{0};  // the position of the next op to check
  // A trace read from a file gives back each value's pages after its last check.
  ReleaseAfterLastUse pages(trace.ops().size(), [&trace](size_t i, const TensorVisitor& visit) {
    VisitValuesReplayReads(trace.ops(), i, visit);
  });
  std::vector<std::thread> running;
  for (size_t t = 1; t < threads; ++t) {
    running.emplace_back([&workers, &next, &pages, t] { workers[t].CheckOps(&next, &pages); });
  }
  workers[0].CheckOps(&next, &pages);
  for (std::thread& thread : running) thread.join();
  for (size_t t = 1; t < threads; ++t) workers[0].Merge(std::move(workers[t]));
  return workers[0].Finish();
}

}  // namespace torchlens
