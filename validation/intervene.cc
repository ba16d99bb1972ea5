#include "validation/intervene.h"

#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "graph/release_after_last_use.h"
#include "torchlens_dispatch/ops/bit_identical.h"
#include "torchlens_dispatch/ops/capture_key.h"
#include "torchlens_dispatch/ops/fused_mutators.h"
#include "torchlens_dispatch/ops/ivalue_tensors.h"
#include "validation/fused_views.h"
#include "validation/op_arguments.h"
#include "validation/replay.h"

namespace torchlens {
namespace {

std::string Describe(const at::Tensor& t) {
  return absl::StrCat("shape [", absl::StrJoin(t.sizes(), ", "), "] dtype ",
                      c10::toString(t.scalar_type()));
}

bool HasNonTensorReturn(const ReplayResult& result) {
  for (const c10::IValue& value : result.returns) {
    if (!ContainsTensor(value) && !value.isNone()) return true;
  }
  return false;
}

// Re-executes the edited trace's cone (see intervene.h).
class Intervention {
 public:
  Intervention(const Trace& trace, DoOptions options)
      : original_(trace.ops()), parts_(trace.Parts()), options_(options) {
    changed_.assign(original_.size(), false);
  }

  // The edits, checked and resolved to node indexes.
  absl::Status Apply(const std::vector<Edit>& edits, const Trace& trace) {
    absl::flat_hash_map<std::pair<int, int>, bool> seen;
    for (const Edit& edit : edits) {
      absl::StatusOr<const Op*> node = trace.Find(edit.label);
      if (!node.ok()) return node.status();
      const Op& op = **node;
      if (!edit.value.defined()) {
        return absl::InvalidArgumentError(
            absl::StrCat("edit of ", op.label, ": the value is an undefined tensor"));
      }
      const int outputs = op.outs.empty() ? 1 : static_cast<int>(op.outs.size());
      if (edit.output < 0 || edit.output >= outputs) {
        return absl::InvalidArgumentError(absl::StrCat("edit of ", op.label, ": output ",
                                                       edit.output, " does not exist; it has ",
                                                       outputs, " (0..", outputs - 1, ")"));
      }
      const at::Tensor& current = OutputValue(op, edit.output);
      if (!current.defined()) {
        return absl::InvalidArgumentError(
            absl::StrCat("edit of ", op.label, ": the node has no saved tensor value to replace",
                         op.is_compute() && !op.saved()
                             ? " (the capture did not save its values: select it with "
                               "CaptureOptions::save_labels, or capture without selective saving)"
                             : ""));
      }
      if (edit.value.sizes() != current.sizes() ||
          edit.value.scalar_type() != current.scalar_type()) {
        return absl::InvalidArgumentError(absl::StrCat("edit of ", op.label, ": the value has ",
                                                       Describe(edit.value), ", the node holds ",
                                                       Describe(current)));
      }
      const int index = trace.IndexOf(&op);
      if (!seen.emplace(std::make_pair(index, edit.output), true).second) {
        return absl::InvalidArgumentError(absl::StrCat("two edits of ", op.label, " output ",
                                                       edit.output, "; give one value per output"));
      }
      edited_.push_back({index, edit.output, edit.value.detach().clone()});
    }
    // Appended after every edit the caller gave: a version the caller edited too keeps
    // the caller's value.
    const size_t given = edited_.size();
    for (size_t e = 0; e < given; ++e) {
      const Op& op = original_[edited_[e].index];
      if (!op.is_buffer_version()) continue;
      if (absl::Status status = EditBuffersOnItsStorage(op, edited_[e].value, trace, &seen);
          !status.ok()) {
        return status;
      }
    }
    return absl::OkStatus();
  }

  // See NOTE [Buffers on one storage] in buffer_journal.cc. The capture attributes each
  // read of a tensor registered under several names to one of them: the edited version's
  // value is also the value of those buffers' versions made at the same point, which take
  // the edit too. A buffer sharing only some of the bytes would need the edit laid out in
  // its own geometry, which the trace does not record: a gap names it.
  absl::Status EditBuffersOnItsStorage(const Op& version, const at::Tensor& value,
                                       const Trace& trace,
                                       absl::flat_hash_map<std::pair<int, int>, bool>* seen) {
    auto buffer = trace.buffers().find(version.address);
    if (buffer == trace.buffers().end()) return absl::OkStatus();
    // The version of buffer `address` made at the same point as `version`, or -1.
    const auto simultaneous = [&](const std::string& address) {
      auto other = trace.buffers().find(address);
      if (other == trace.buffers().end()) return -1;
      for (const Op* candidate : other->second.versions) {
        if (candidate->buffer_write_kind == version.buffer_write_kind &&
            candidate->parents == version.parents) {
          return trace.IndexOf(candidate);
        }
      }
      return -1;
    };
    for (const std::string& address : buffer->second.same_tensor_as) {
      const int twin = simultaneous(address);
      if (twin >= 0 && seen->emplace(std::make_pair(twin, 0), true).second) {
        edited_.push_back({twin, 0, value});
      }
    }
    for (const std::string& address : buffer->second.shares_storage_with) {
      const int other = simultaneous(address);
      if (other >= 0 && seen->contains(std::make_pair(other, 0))) continue;  // edited too
      absl::Status status =
          Gap(DiagnosticKind::kBufferThreadGap, version.label,
              absl::StrCat("buffer ", version.address, " shares some of its bytes with buffer ",
                           address, ": reads the capture recorded through ", address,
                           " keep their captured values; edit its version too for them to change"));
      if (!status.ok()) return status;
    }
    return absl::OkStatus();
  }

  // NOTE [Selective saving]: every op the edits reach is re-run from its saved arguments,
  // so a partly saved trace can be intervened on only where the cone is saved.
  absl::Status CheckConeIsSaved() const {
    std::vector<bool> reached(original_.size(), false);
    for (const EditedValue& edit : edited_) reached[edit.index] = true;
    std::vector<std::string> unsaved;
    for (size_t i = 0; i < original_.size(); ++i) {
      const Op& op = original_[i];
      for (int32_t parent : op.parent_indices)
        reached[i] = reached[i] || (parent >= 0 && reached[parent]);
      // A saved op's alias write of a tensor whose value was not saved has no value either
      // (NOTE [Dead views are written too] in torchlens_dispatch/saved_value_index.h).
      const bool values_unsaved =
          !op.saved() ||
          std::any_of(op.alias_writes.begin(), op.alias_writes.end(),
                      [](const AliasWrite& write) { return !write.value.defined(); });
      if (reached[i] && op.is_compute() && values_unsaved) unsaved.push_back(op.label);
    }
    if (unsaved.empty()) return absl::OkStatus();
    constexpr size_t kNamed = 8;
    const size_t named = std::min(unsaved.size(), kNamed);
    return absl::FailedPreconditionError(absl::StrCat(
        "the edits reach ", unsaved.size(),
        " ops whose values the capture did not save, and Do "
        "re-runs each from its saved arguments: ",
        absl::StrJoin(unsaved.begin(), unsaved.begin() + named, ", "),
        unsaved.size() > named ? absl::StrCat(" and ", unsaved.size() - named, " more") : "",
        ". Capture again saving them (CaptureOptions::save_labels, save_modules, ...) or "
        "without selective saving"));
  }

  // NOTE [Edits of views]
  // An edited op whose output is a view (`y = x[1]`) shares memory with what it was made
  // of, so in PyTorch setting its value sets those bytes of `x` too. The fork replaces the
  // view's value from its op on, and a write through the view carries it into the base
  // (NOTE [Writes through aliases] in replay.h). Ops that read `x` itself after the view
  // was made, not through such a write, keep their captured values: a gap names them.
  absl::Status CheckEditedViews() {
    for (const EditedValue& edit : edited_) {
      const ArgSource* base = ViewedSource(original_[edit.index], edit.output);
      if (base == nullptr) continue;
      std::vector<std::string> readers;
      for (size_t j = edit.index + 1; j < original_.size(); ++j) {
        const bool edited = std::any_of(edited_.begin(), edited_.end(), [&](const EditedValue& e) {
          return e.index == static_cast<int>(j);
        });
        if (edited) continue;
        for (const ArgSource& source : original_[j].arg_sources) {
          if (SameSource(source, *base)) {
            readers.push_back(original_[j].label);
            break;
          }
        }
      }
      if (readers.empty()) continue;
      constexpr size_t kNamed = 8;
      const size_t named = std::min(readers.size(), kNamed);
      const std::string& label = original_[edit.index].label;
      absl::Status status = Gap(
          DiagnosticKind::kAliasWriteGap, label,
          absl::StrCat(
              "the edit of ", label, ", a view of ", base->name, ", does not reach what reads ",
              base->name, " after it (",
              absl::StrJoin(readers.begin(), readers.begin() + named, ", "),
              readers.size() > named ? absl::StrCat(" and ", readers.size() - named, " more") : "",
              "), which keeps its captured value; in PyTorch the two share memory: "
              "edit ",
              base->name, " too for them to see the change (NOTE [Edits of views])"));
      if (!status.ok()) return status;
    }
    return absl::OkStatus();
  }

  absl::StatusOr<DoResult> Run() {
    if (absl::Status saved = CheckConeIsSaved(); !saved.ok()) return saved;
    if (absl::Status views = CheckEditedViews(); !views.ok()) return views;
    std::vector<Op>& ops = parts_.ops;
    for (const EditedValue& edit : edited_) {
      Op& op = ops[edit.index];
      if (op.outs.empty() || edit.output == 0) op.out = edit.value;
      if (!op.outs.empty()) op.outs.mutable_at(edit.output) = edit.value;
      changed_[edit.index] = true;
      if (op.is_buffer_version() && !op.buffer_write_kind.has_value()) {
        parts_.buffers[op.address].initial_value = edit.value;  // the edited world's start
      }
    }
    // A trace read from a file gives back the pages of captured values no op ahead reads:
    // Do reads from disk the cone it replays and its arguments, and keeps no more of them.
    ReleaseAfterLastUse pages(original_.size(), [this](size_t i, const TensorVisitor& visit) {
      VisitValuesReplayReads(original_, i, visit);
    });
    for (size_t i = 0; i < ops.size(); ++i) {
      if (absl::Status status = ReExecute(i); !status.ok()) return status;
      pages.Done(i);
      if (!options_.keep_values) DropValuesReadFor(i);
    }
    if (!options_.keep_values) parts_.has_saved_values = false;
    parts_.children_linked = true;
    result_.trace = Trace::Assemble(std::move(parts_));
    return std::move(result_);
  }

 private:
  struct EditedValue {
    int index;
    int output;
    at::Tensor value;
  };

  // Re-executes ops[i] when it is in the cone.
  absl::Status ReExecute(size_t i) {
    Op& op = parts_.ops[i];
    if (changed_[i] || !InCone(op) || op.is_input() || op.is_constant()) return absl::OkStatus();
    changed_[i] = true;
    return op.is_output()           ? Output(op)
           : op.is_buffer_version() ? BufferVersion(i, op)
                                    : Compute(i, op);
  }

  // NOTE [Forks that keep only their results] (intervene.h): ops[i] has been re-executed
  // (or was outside the cone); drops the values of its re-executed parents, and its own,
  // that no op ahead of it reads.
  void DropValuesReadFor(size_t i) {
    if (readers_left_.empty()) {
      readers_left_.resize(original_.size());
      for (size_t j = 0; j < original_.size(); ++j) {
        readers_left_[j] = static_cast<int32_t>(original_[j].child_indices.size());
      }
    }
    for (int32_t parent : original_[i].parent_indices) {
      if (parent >= 0 && --readers_left_[parent] == 0) DropValues(parent);
    }
    if (readers_left_[i] == 0) DropValues(i);
  }

  // Drops node `j`'s re-executed values, unless it is an output or a buffer version.
  void DropValues(size_t j) {
    Op& op = parts_.ops[j];
    if (!changed_[j] || !op.is_compute()) return;
    for (const EditedValue& edit : edited_) {
      if (edit.index == static_cast<int>(j)) return;  // the user's value stays
    }
    op.out = at::Tensor();
    op.outs = {};
    op.creation_args = {};
    for (AliasWrite& write : op.alias_writes) write.value = at::Tensor();
  }

  bool InCone(const Op& op) const {
    for (int32_t parent : op.parent_indices) {
      if (parent >= 0 && changed_[parent]) return true;
    }
    return false;
  }

  // The fork's value of a source (the captured one when it is outside the cone).
  at::Tensor ForkValue(const ArgSource& source, const at::Tensor& captured) const {
    const Op* node = SourceNode(original_, source);
    if (node == nullptr || !changed_[source.node]) return captured;
    return OutputValue(parts_.ops[source.node], source.output_index);
  }

  absl::Status Gap(DiagnosticKind kind, const std::string& label, std::string message) {
    if (options_.strict) return absl::FailedPreconditionError(message);
    result_.warnings.push_back(Diagnostic{kind, label, std::move(message)});
    return absl::OkStatus();
  }

  absl::Status Output(Op& op) {
    const int output = op.arg_sources.empty() ? 0 : op.arg_sources[0].output_index;
    const int producer = op.parent_indices[0];
    op.out = OutputValue(parts_.ops[producer], output);
    op.outs = {op.out};
    return absl::OkStatus();
  }

  absl::Status BufferVersion(size_t i, Op& op) {
    // See NOTE [Threading buffer state].
    const int producer = op.parent_indices[0];
    std::string gap;
    if (op.buffer_write_kind == WriteKind::kFused) {
      auto it = fused_after_.find(i);
      if (it != fused_after_.end()) {
        op.out = it->second;
        op.outs = {op.out};
        result_.reexecuted.push_back(op.label);
        return absl::OkStatus();
      }
      auto why = fused_gaps_.find(i);
      gap = why != fused_gaps_.end()
                ? why->second
                : absl::StrCat("its producer ", parts_.ops[producer].label,
                               " was edited, so the kernel's update of the running statistics "
                               "was not recomputed");
    } else {
      const int output = op.arg_sources.empty() ? 0 : op.arg_sources[0].output_index;
      const at::Tensor& captured_written = OutputValue(original_[producer], output);
      const at::Tensor& recomputed = OutputValue(parts_.ops[producer], output);
      if (!BitIdentical(captured_written, original_[i].out)) {
        gap = absl::StrCat("its producer ", parts_.ops[producer].label,
                           " did not give the whole buffer as a value it can recompute");
      } else if (output < 0 && !alias_certified_.contains({producer, output})) {
        gap = absl::StrCat(parts_.ops[producer].label,
                           " wrote it through a slice or view in a way replay cannot redo");
      } else if (recomputed.defined()) {
        op.out = recomputed;
        op.outs = {op.out};
        result_.reexecuted.push_back(op.label);
        return absl::OkStatus();
      }
    }
    changed_[i] = false;  // readers keep the captured state
    return Gap(DiagnosticKind::kBufferThreadGap, op.label,
               absl::StrCat("buffer version ", op.label, " (", op.address, ":", op.buffer_pass,
                            ") keeps its captured value: ", gap,
                            "; the edit does not propagate through it"));
  }

  absl::Status Compute(size_t i, Op& op) {
    const Op& captured = original_[i];
    std::vector<c10::IValue> args =
        ReplayArguments(op, [&](int, const ArgSource& source, const at::Tensor& saved) {
          return ForkValue(source, saved);
        });
    op.creation_args = args;  // the fork's op ran on these: a fork of the fork replays them
    absl::StatusOr<ReplayResult> replay = ReplayOp(op, args);
    if (!replay.ok()) {
      return absl::Status(replay.status().code(),
                          absl::StrCat("re-executing ", op.label, ": ", replay.status().message()));
    }
    // Captured-value replays certify what a recomputation may replace (computed once, only
    // for ops with something to certify).
    std::optional<absl::StatusOr<ReplayResult>> reference;
    auto captured_replay = [&]() -> const absl::StatusOr<ReplayResult>& {
      if (!reference.has_value()) reference = ReplayOp(captured, CapturedArguments(captured));
      return *reference;
    };

    // See NOTE [Values that leave the graph].
    if (HasNonTensorReturn(*replay)) {
      const absl::StatusOr<ReplayResult>& before = captured_replay();
      if (!before.ok() || !SameNonTensorReturns(*replay, *before)) {
        absl::Status status =
            Gap(DiagnosticKind::kNonTensorGap, op.label,
                absl::StrCat(op.label, " (", op.func_name,
                             ") now returns another non-tensor value; the code that read it (a "
                             "condition, or a scalar argument of a later op) is not in the graph, "
                             "so the ops after it keep their captured values"));
        if (!status.ok()) return status;
      }
    }

    // See NOTE [Fused writes through views]: the captured call, redone on views of the
    // captured version, must give the captured version for the fork's redo to stand in.
    std::optional<std::optional<FusedWriteRedone>> through_views;
    auto redone_through_views = [&]() -> const std::optional<FusedWriteRedone>& {
      if (through_views.has_value()) return *through_views;
      through_views.emplace();
      absl::StatusOr<FusedWriteRedone> reference = RedoFusedWriteThroughViews(captured, original_);
      if (!reference.ok()) return *through_views;
      std::vector<int> versions;
      for (const auto& [before, after] : reference->buffers) {
        const int version = FusedVersionOf(captured, before->address);
        if (version < 0 || !BitIdentical(after, original_[version].out)) return *through_views;
        versions.push_back(version);
      }
      for (const AliasWrite& write : captured.alias_writes) {
        const Op* view = write.written_tensor < 0 ? SourceNode(original_, write.before) : nullptr;
        if (view == nullptr) continue;
        absl::StatusOr<at::Tensor> after =
            ViewAfterFusedWrite(*view, write.before.output_index, *reference, original_);
        if (!after.ok() || !BitIdentical(*after, write.value)) return *through_views;
      }
      absl::StatusOr<FusedWriteRedone> fork = RedoFusedWriteThroughViews(op, parts_.ops);
      if (fork.ok() && fork->buffers.size() == versions.size()) {
        for (size_t b = 0; b < versions.size(); ++b) {
          fused_after_[versions[b]] = fork->buffers[b].second;
        }
        through_views = *std::move(fork);
      }
      return *through_views;
    };

    // See NOTE [Writes through aliases].
    for (size_t k = 0; k < op.alias_writes.size(); ++k) {
      AliasWrite& write = op.alias_writes[k];
      const AliasWrite& captured_write = captured.alias_writes[k];
      const int output = -static_cast<int>(k) - 1;
      const at::Tensor* captured_before = CapturedValue(captured_write.before);
      bool certified = false;
      if (captured_before != nullptr) {
        absl::StatusOr<at::Tensor> redone = ReplayAliasWrite(
            captured, captured_write, CapturedArguments(captured), *captured_before);
        certified = redone.ok() && BitIdentical(*redone, captured_write.value);
      }
      // Redone on the fork's earlier value when redoing it on the captured one gave the
      // captured value; else, for a fused mutator's write, through views when the captured
      // call redone so gave every captured value (redone_through_views).
      const at::Tensor fork_before =
          certified ? ForkValue(write.before, *captured_before) : at::Tensor();
      absl::StatusOr<at::Tensor> after =
          RedoAliasWrite(op, write, args, certified ? &fork_before : nullptr, parts_.ops, [&] {
            const std::optional<FusedWriteRedone>& redone = redone_through_views();
            return redone.has_value() ? &*redone : nullptr;
          });
      if (after.ok()) {
        write.value = *after;
        alias_certified_.insert({static_cast<int>(i), output});
        continue;
      }
      if (!WritesBuffer(op, output)) {
        absl::Status status =
            Gap(DiagnosticKind::kAliasWriteGap, op.label,
                absl::StrCat("the tensor ", op.label, " changed through a view (from ",
                             write.before.name,
                             ") keeps its captured value: replay cannot redo "
                             "the write; the edit does not propagate through it"));
        if (!status.ok()) return status;
      }
    }

    if (FindFusedMutator(op.func_name) != nullptr) (void)redone_through_views();
    // NOTE [Fused buffer writes]: the state after the call, when the captured call
    // reproduces the captured versions.
    if (!replay->state_after.empty()) {
      const absl::StatusOr<ReplayResult>& before = captured_replay();
      for (const auto& [argument, after] : replay->state_after) {
        const int version = FusedVersion(op, argument);
        if (version < 0) continue;
        const at::Tensor* reproduced = nullptr;
        if (before.ok()) {
          for (const auto& [a, state] : before->state_after) {
            if (a == argument) reproduced = &state;
          }
        }
        if (reproduced != nullptr && BitIdentical(*reproduced, original_[version].out)) {
          fused_after_[version] = after;
        } else {
          fused_gaps_[version] = absl::StrCat("re-running ", op.label,
                                              " from the captured state does not reproduce it");
        }
      }
    }
    op.outs = std::move(replay->outputs);
    op.out = op.outs.empty() ? at::Tensor() : op.outs[0];
    result_.reexecuted.push_back(op.label);
    return absl::OkStatus();
  }

  const at::Tensor* CapturedValue(const ArgSource& source) const {
    const Op* node = SourceNode(original_, source);
    return node == nullptr ? nullptr : &OutputValue(*node, source.output_index);
  }

  // Whether output `output` of `op` is the value of a buffer version (whose gap, if any,
  // is reported there).
  bool WritesBuffer(const Op& op, int output) const {
    for (int32_t index : op.child_indices) {
      if (index >= 0 && original_[index].is_buffer_version() &&
          !original_[index].arg_sources.empty() &&
          original_[index].arg_sources[0].output_index == output) {
        return true;
      }
    }
    return false;
  }

  // The kFused version of buffer `address` that `op` wrote, or -1.
  int FusedVersionOf(const Op& op, const std::string& address) const {
    for (int32_t child : op.child_indices) {
      if (child >= 0 && original_[child].is_buffer_version() &&
          original_[child].address == address &&
          original_[child].buffer_write_kind == WriteKind::kFused) {
        return child;
      }
    }
    return -1;
  }

  // The kFused version node of the buffer that state argument `argument` of `op` held.
  int FusedVersion(const Op& op, int argument) const {
    const FusedStateVersions versions = FindFusedStateVersions(op, argument, original_);
    return versions.written == nullptr ? -1 : static_cast<int>(versions.written - original_.data());
  }

  const std::vector<Op>& original_;
  TraceParts parts_;
  DoOptions options_;
  std::vector<int32_t> readers_left_;  // per node, without DoOptions::keep_values
  std::vector<bool> changed_;          // edited or re-executed
  std::vector<EditedValue> edited_;
  absl::flat_hash_map<size_t, at::Tensor> fused_after_;       // version -> recomputed state
  absl::flat_hash_map<size_t, std::string> fused_gaps_;       // version -> why not
  absl::flat_hash_set<std::pair<int, int>> alias_certified_;  // (op, output) recomputed
  DoResult result_;
};

}  // namespace

absl::string_view DiagnosticKindName(DiagnosticKind kind) {
  switch (kind) {
    case DiagnosticKind::kBufferThreadGap:
      return "buffer_thread_gap";
    case DiagnosticKind::kNonTensorGap:
      return "non_tensor_gap";
    case DiagnosticKind::kAliasWriteGap:
      return "alias_write_gap";
  }
  return "unknown";
}

absl::StatusOr<DoResult> Do(const Trace& trace, std::vector<Edit> edits, DoOptions options) {
  if (absl::Status saved = RequireSavedValues(trace, "intervene on it"); !saved.ok()) return saved;
  c10::impl::ExcludeDispatchKeyGuard not_captured(kCaptureKey);
  Intervention intervention(trace, options);
  if (absl::Status status = intervention.Apply(edits, trace); !status.ok()) return status;
  return intervention.Run();
}

}  // namespace torchlens
