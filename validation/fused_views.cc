#include "validation/fused_views.h"

#include <ATen/ATen.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "torchlens_dispatch/ops/capture_key.h"
#include "torchlens_dispatch/ops/fused_mutators.h"
#include "torchlens_dispatch/ops/inplace_view.h"
#include "torchlens_dispatch/ops/ivalue_tensors.h"
#include "torchlens_dispatch/ops/saved_copy.h"
#include "torchlens_dispatch/ops/storage_ranges.h"
#include "validation/op_arguments.h"
#include "validation/replay.h"

namespace torchlens {

namespace {

// The longest chain of view ops, and of alias writes each naming the one before (one per
// earlier write of the same views: a loop's batch norms), followed back to a buffer version.
constexpr int kMaxViewChain = 16;
constexpr int kMaxAliasWriteChain = 64;

// The tensor output `output` of `node` names as a view: for an alias write's value
// (output < 0), the tensor it changed, which is the one its `before` names.
std::pair<const Op*, int> ViewNamed(const Op* node, int output, const std::vector<Op>& nodes) {
  for (int depth = 0; node != nullptr && output < 0 && depth <= kMaxAliasWriteChain; ++depth) {
    const size_t k = static_cast<size_t>(-(output + 1));
    if (k >= node->alias_writes.size()) return {nullptr, 0};
    const ArgSource& before = node->alias_writes[k].before;
    node = SourceNode(nodes, before);
    output = before.output_index;
  }
  return {output < 0 ? nullptr : node, output};
}

// For output `output` of `node`, an argument `node` wrote in place and returns as that
// output (`fill_`'s and `add_`'s self, an out= op's `out`): its tensor index, as in
// FirstTensorOfArguments; -1 for any other output.
int ReturnedWrittenArgument(const Op& node, int output) {
  absl::StatusOr<c10::OperatorHandle> handle = OperatorOf(node);
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
  absl::StatusOr<c10::OperatorHandle> handle = OperatorOf(node);
  const bool inplace_view = handle.ok() && IsInplaceView(*handle);
  return {&node.arg_sources[index], !inplace_view, inplace_view};
}

// The buffer version a view was made of: up the tensors each step names (and through alias
// writes' values to the tensors they changed) to the first buffer version, or null.
const Op* RootVersion(const Op* node, int output, const std::vector<Op>& nodes) {
  for (int depth = 0; depth <= kMaxViewChain; ++depth) {
    std::tie(node, output) = ViewNamed(node, output, nodes);
    if (node == nullptr || node->is_buffer_version()) return node;
    const ViewSource step = SourceOfView(*node, output);
    if (step.source == nullptr) return nullptr;
    output = step.source->output_index;
    node = SourceNode(nodes, *step.source);
  }
  return nullptr;
}

// The version of `root`'s buffer that `op` wrote through views made of `root`: the one
// before the version `op` made. Views made of an earlier version see every in-place write
// since, unless the buffer was reassigned in between, when the views are of a tensor the
// buffer no longer is (null). `root` itself when `op` made no later version of it.
const Op* VersionBeforeWrite(const Op& op, const Op& root, const std::vector<Op>& nodes) {
  // `root` is one of `nodes`; a buffer's versions are nodes in the order of its writes, so
  // the versions between two of them lie between them in `nodes`.
  const int32_t root_at = static_cast<int32_t>(&root - nodes.data());
  for (int32_t child : op.child_indices) {
    const Op* written =
        child >= 0 && static_cast<size_t>(child) < nodes.size() ? &nodes[child] : nullptr;
    if (written == nullptr || !written->is_buffer_version() || written->address != root.address ||
        written->buffer_pass <= root.buffer_pass) {
      continue;
    }
    // Every version in between must be there, none a reassignment.
    const Op* before = &root;
    int between = 0;
    for (int32_t at = root_at + 1; at < child; ++at) {
      const Op& version = nodes[at];
      if (!version.is_buffer_version() || version.address != root.address ||
          version.buffer_pass <= root.buffer_pass || version.buffer_pass >= written->buffer_pass) {
        continue;
      }
      if (version.buffer_write_kind == WriteKind::kReassign) return nullptr;
      ++between;
      if (version.buffer_pass == written->buffer_pass - 1) before = &version;
    }
    if (between != written->buffer_pass - root.buffer_pass - 1) return nullptr;
    return before;
  }
  return &root;
}

// Output `output` of `view`, made again of `base` (the value of a version of buffer
// `address`) by re-running the view ops between them, each on the tensor SourceOfView
// names; an op that returns an argument it wrote is not re-run (`base` holds its write).
// An error unless every step is a view of `base`. See NOTE [Fused writes through views].
absl::StatusOr<at::Tensor> RemadeView(const Op* view, int output, const std::string& address,
                                      const at::Tensor& base, const std::vector<Op>& nodes,
                                      int depth) {
  std::tie(view, output) = ViewNamed(view, output, nodes);
  if (view == nullptr || depth > kMaxViewChain) {
    return absl::FailedPreconditionError("not a chain of views of a buffer");
  }
  if (view->is_buffer_version()) {
    if (view->address == address) return base;
    return absl::FailedPreconditionError(absl::StrCat(view->label, " is another buffer"));
  }
  const ViewSource step = SourceOfView(*view, output);
  if (step.source == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(view->label, " is not a view"));
  }
  absl::StatusOr<at::Tensor> parent_view = RemadeView(
      SourceNode(nodes, *step.source), step.source->output_index, address, base, nodes, depth + 1);
  if (!parent_view.ok() || step.same_tensor) return parent_view;
  // An in-place view op changes the geometry of the tensor it is given: an alias of the
  // parent view, made for the call.
  std::vector<c10::IValue> args =
      ReplayArguments(*view, [&](int index, const ArgSource&, const at::Tensor& saved) {
        if (index != 0) return saved;
        return step.inplace_view ? parent_view->alias() : *parent_view;
      });
  absl::StatusOr<ReplayResult> remade =
      step.inplace_view ? ReplayOp(*view, std::move(args), /*private_tensors=*/{0})
                        : ReplayOp(*view, std::move(args));
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
                                                            const std::vector<Op>& nodes) {
  // See NOTE [Fused writes through views].
  const FusedMutator* fused = FindFusedMutator(op.func_name);
  std::vector<c10::IValue> args = CapturedArguments(op);
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
        const Op* state = SourceNode(nodes, source);
        return state != nullptr && !state->is_buffer_version();
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
    const Op* state = SourceNode(nodes, source);
    const Op* made_of = RootVersion(state, source.output_index, nodes);
    const Op* root = made_of == nullptr ? nullptr : VersionBeforeWrite(op, *made_of, nodes);
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
        RemadeView(state, source.output_index, root->address, *copy, nodes, 0);
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
  absl::StatusOr<ReplayResult> result = ReplayOp(op, std::move(args), private_tensors);
  if (!result.ok()) return result.status();
  return redone;
}

absl::StatusOr<at::Tensor> ViewAfterFusedWrite(const Op& view, int output,
                                               const FusedWriteRedone& redone,
                                               const std::vector<Op>& nodes) {
  c10::impl::ExcludeDispatchKeyGuard not_captured(kCaptureKey);
  const Op* root = RootVersion(&view, output, nodes);
  const at::Tensor* copy = root == nullptr ? nullptr : redone.After(root->address);
  if (copy == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(view.label, " is not a view of a buffer the call wrote"));
  }
  absl::StatusOr<at::Tensor> remade = RemadeView(&view, output, root->address, *copy, nodes, 0);
  if (!remade.ok()) return remade.status();
  return remade->clone();
}

absl::StatusOr<at::Tensor> RedoAliasWrite(
    const Op& op, const AliasWrite& write, std::vector<c10::IValue> args, const at::Tensor* before,
    const std::vector<Op>& nodes, absl::FunctionRef<const FusedWriteRedone*()> through_views) {
  absl::StatusOr<at::Tensor> after =
      before != nullptr ? ReplayAliasWrite(op, write, std::move(args), *before)
                        : absl::FailedPreconditionError(
                              absl::StrCat(op.label, ": no earlier value to redo the write on"));
  if (after.ok() || write.written_tensor >= 0) return after;
  const Op* view = SourceNode(nodes, write.before);
  if (view == nullptr) return after;
  // See NOTE [Fused writes through views].
  const FusedWriteRedone* redone = through_views();
  if (redone == nullptr) return after;
  return ViewAfterFusedWrite(*view, write.before.output_index, *redone, nodes);
}

}  // namespace torchlens
