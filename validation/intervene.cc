#include "validation/intervene.h"

#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "torchlens_dispatch/capture_key.h"
#include "validation/replay.h"

namespace torchlens {
namespace {

std::string Describe(const at::Tensor& t) {
  return absl::StrCat("shape [", absl::StrJoin(t.sizes(), ", "), "] dtype ",
                      c10::toString(t.scalar_type()));
}

bool Identical(const at::Tensor& a, const at::Tensor& b) {
  return a.defined() && b.defined() && a.sizes() == b.sizes() &&
         a.scalar_type() == b.scalar_type() &&
         (a.unsafeGetTensorImpl() == b.unsafeGetTensorImpl() || at::equal(a, b));
}

// The value a consumer reads from node `op` at `output_index`.
const at::Tensor& ValueOf(const Op& op, int output_index) {
  if (output_index >= 0 && output_index < static_cast<int>(op.outs.size())) {
    return op.outs[output_index];
  }
  return op.out;
}

// Which output of `producer` the output node `output` returned (they share the tensor).
int OutputIndex(const Op& producer, const Op& output) {
  for (size_t k = 0; k < producer.outs.size(); ++k) {
    if (Identical(producer.outs[k], output.out)) return static_cast<int>(k);
  }
  return 0;
}

}  // namespace

absl::StatusOr<DoResult> Do(const Trace& trace, std::vector<Edit> edits, DoOptions options) {
  if (!trace.has_saved_values()) {
    return absl::FailedPreconditionError(
        "the trace holds no saved values to replay from: capture with "
        "CaptureOptions::save_activations = true (the default) to intervene on it");
  }
  c10::impl::ExcludeDispatchKeyGuard not_captured(kCaptureKey);

  // Resolve and check every edit before changing anything.
  absl::flat_hash_map<int, at::Tensor> edited;  // node index -> private copy of the value
  for (const Edit& edit : edits) {
    absl::StatusOr<const Op*> node = trace.Find(edit.label);
    if (!node.ok()) return node.status();
    const Op& op = **node;
    if (!edit.value.defined()) {
      return absl::InvalidArgumentError(
          absl::StrCat("edit of ", op.label, ": the value is an undefined tensor"));
    }
    if (!op.out.defined()) {
      return absl::InvalidArgumentError(
          absl::StrCat("edit of ", op.label, ": the node has no tensor value to replace"));
    }
    if (edit.value.sizes() != op.out.sizes() || edit.value.scalar_type() != op.out.scalar_type()) {
      return absl::InvalidArgumentError(absl::StrCat("edit of ", op.label, ": the value has ",
                                                     Describe(edit.value), ", the node holds ",
                                                     Describe(op.out)));
    }
    const int index = trace.IndexOf(&op);
    if (edited.contains(index)) {
      return absl::InvalidArgumentError(
          absl::StrCat("two edits of ", op.label, "; give one value per node"));
    }
    edited.emplace(index, edit.value.detach().clone());
  }

  DoResult result{trace, {}, {}};
  std::vector<Op>& ops = result.trace.mutable_ops();
  const std::vector<Op>& original = trace.ops();
  absl::flat_hash_map<absl::string_view, int> index_of;
  for (size_t i = 0; i < original.size(); ++i) index_of.emplace(original[i].label, i);
  std::vector<bool> changed(ops.size(), false);  // edited or re-executed

  for (size_t i = 0; i < ops.size(); ++i) {
    Op& op = ops[i];
    if (auto it = edited.find(static_cast<int>(i)); it != edited.end()) {
      op.out = it->second;
      if (!op.outs.empty()) op.outs[0] = it->second;
      changed[i] = true;
      continue;
    }
    bool in_cone = false;
    for (const std::string& parent : op.parents) {
      auto it = index_of.find(parent);
      if (it != index_of.end() && changed[it->second]) in_cone = true;
    }
    if (!in_cone || op.is_input()) continue;
    changed[i] = true;

    if (op.is_output()) {
      const Op& producer = ops[index_of.at(op.parents[0])];
      op.out = ValueOf(producer, OutputIndex(original[index_of.at(op.parents[0])], original[i]));
      op.outs = {op.out};
      continue;
    }

    if (op.is_buffer) {
      // NOTE [Threading buffer state]
      const Op& captured_producer = original[index_of.at(op.parents[0])];
      const Op& producer = ops[index_of.at(op.parents[0])];
      std::string gap;
      if (op.buffer_write_kind == WriteKind::kFused) {
        if (op.buffer_value_changed.value_or(true)) {
          gap = absl::StrCat("a fused write by ", producer.label,
                             " (the kernel updates the running statistics internally; its "
                             "post-write state is not an output of the op)");
        }
      } else {
        int certified = -1;
        for (size_t k = 0; k < captured_producer.outs.size(); ++k) {
          if (Identical(captured_producer.outs[k], original[i].out))
            certified = static_cast<int>(k);
        }
        if (certified < 0) {
          gap = absl::StrCat("its producer ", producer.label,
                             " output is not the whole buffer (a write through a slice or "
                             "view), so the post-write state cannot be recomputed");
        } else {
          op.out = ValueOf(producer, certified);
          op.outs = {op.out};
          result.reexecuted.push_back(op.label);
          continue;
        }
      }
      if (gap.empty()) {
        changed[i] = false;  // value independent of the edit
        continue;
      }
      const std::string message = absl::StrCat("buffer version ", op.label, " (", op.address, ":",
                                               op.buffer_pass, ") keeps its captured value: ", gap,
                                               "; the edit does not propagate through it");
      if (options.strict) return absl::FailedPreconditionError(message);
      result.warnings.push_back(Diagnostic{DiagnosticKind::kBufferThreadGap, op.label, message});
      changed[i] = false;  // readers keep the captured state
      continue;
    }

    // A compute op: re-execute from the fork's current values of its sources.
    std::vector<c10::IValue> args = ReplayArguments(
        op, [&](int, const ArgSource& source, const at::Tensor& saved) -> at::Tensor {
          // A base written through a view (output -1) is not recomputed: README "Limitations".
          if (source.kind != ArgSource::Kind::kNode || source.output_index < 0) return saved;
          auto it = index_of.find(source.name);
          if (it == index_of.end() || !changed[it->second]) return saved;
          return ValueOf(ops[it->second], source.output_index);
        });
    op.creation_args = args;  // the fork's op ran on these: a fork of the fork replays them
    absl::StatusOr<ReplayResult> replay = ReplayOp(op, std::move(args));
    if (!replay.ok()) {
      return absl::Status(replay.status().code(),
                          absl::StrCat("re-executing ", op.label, ": ", replay.status().message()));
    }
    op.outs = std::move(replay->outputs);
    op.out = op.outs.empty() ? at::Tensor() : op.outs[0];
    result.reexecuted.push_back(op.label);
  }
  result.trace.Relink();
  return result;
}

}  // namespace torchlens
