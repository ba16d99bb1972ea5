#include "torchlens_dispatch/recorder.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "graph/label.h"
#include "torchlens_dispatch/ops/capture_key.h"
#include "torchlens_dispatch/ops/exception_text.h"
#include "torchlens_dispatch/ops/exemptions.h"
#include "torchlens_dispatch/ops/inplace_view.h"
#include "torchlens_dispatch/ops/ivalue_tensors.h"
#include "torchlens_dispatch/ops/op_names.h"
#include "torchlens_dispatch/ops/randomness.h"
#include "torchlens_dispatch/ops/saved_copy.h"
#include "torchlens_dispatch/testing.h"
#include "torchlens_dispatch/write_watch.h"

namespace torchlens {
namespace {

// The capturing recorder of this thread. See NOTE [User-level and nested ops].
thread_local Recorder* current_recorder = nullptr;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

class DepthGuard {
 public:
  explicit DepthGuard(int* depth) : depth_(depth) { ++*depth_; }
  ~DepthGuard() { --*depth_; }
  DepthGuard(const DepthGuard&) = delete;
  DepthGuard& operator=(const DepthGuard&) = delete;

 private:
  int* depth_;
};

// The identity of a tensor's version counter (NOTE [Address reuse in unsaved mode]).
// VariableVersion's one member is the intrusive pointer to the counter, and it offers no
// accessor for it.
static_assert(sizeof(c10::VariableVersion) == sizeof(void*),
              "c10::VariableVersion is no longer a single pointer; revisit CounterOf");
const void* CounterOf(const c10::VariableVersion& version) {
  const void* counter;
  std::memcpy(&counter, &version, sizeof(counter));
  return counter;
}

}  // namespace

Recorder* Recorder::Current() { return current_recorder; }

void Recorder::SetCurrent(Recorder* recorder) { current_recorder = recorder; }

Recorder::Recorder(std::shared_ptr<const ModelLayout> layout, bool training, CaptureOptions options)
    : layout_(std::move(layout)),
      options_(options),
      record_(options_.save_activations, training),
      placement_(*layout_),
      policy_(options_, *layout_),
      params_(*layout_),
      journal_(*layout_, &record_, this, options_.save_activations) {
  NoCapture no_capture(kCaptureKey);
  if (options_.value_sink) record_.SetValueSink(&options_.value_sink, policy_.streaming());
  CaptureRecord& record = record_.record();
  record.module_addresses = layout_->module_addresses;
  record.layout = layout_;
  record.param_addresses = layout_->param_addresses;
  if (options_.save_activations) {  // NOTE [Parameters read by reference]
    record.param_values =
        std::shared_ptr<const std::vector<at::Tensor>>(layout_, &layout_->param_values);
  }
  record.modules = layout_->trace_modules;
  record.params = layout_->trace_params;
  const ModelLayout::CaptureSizes& last = layout_->last_capture_sizes;
  constexpr auto kRelaxed = std::memory_order_relaxed;
  tensors_.reserve(last.tensors.load(kRelaxed));
  index_.storages().reserve(last.storages.load(kRelaxed));
  index_.unindexed().reserve(last.slots.load(kRelaxed));
  record.layer_positions.reserve(last.layers.load(kRelaxed));
  record_.Reserve(last);
  // Parameters are recognised on first use (AddUnseen), not registered one by one here:
  // see NOTE [Model layouts].
  for (const ModelLayout::AttributeEntry& attribute : layout_->tensor_attributes) {
    const c10::TensorImpl* impl =
        attribute.tensor.defined() ? attribute.tensor.unsafeGetTensorImpl()
        : attribute.owner != nullptr && attribute.owner->getSlot(attribute.slot).isTensor()
            ? attribute.owner->getSlot(attribute.slot).unsafeToTensorImpl()
            : nullptr;
    if (impl == nullptr) continue;
    attributes_.emplace(impl, static_cast<int32_t>(record.constant_addresses.size()));
    record.constant_addresses.push_back(attribute.address);
  }
}

const Recorder::OpInfo& Recorder::Info(const c10::OperatorHandle& op) {
  const c10::FunctionSchema& schema = op.schema();
  auto [it, inserted] = op_infos_.try_emplace(&schema);
  if (inserted) {
    OpInfo& info = it->second;
    info.index = static_cast<int32_t>(record_.record().operators.size());
    record_.record().operators.push_back(op.operator_name());
    info.num_arguments = static_cast<uint32_t>(schema.arguments().size());
    info.num_returns = static_cast<uint32_t>(schema.returns().size());
    for (uint32_t a = 0; a < info.num_arguments; ++a) {
      const c10::AliasInfo* alias = schema.arguments()[a].alias_info();
      if (alias != nullptr && alias->isWrite()) info.written_arguments.push_back(a);
    }
    info.fused = FindFusedMutator(schema.name());
    info.symbol = c10::Symbol::fromQualString(schema.name());
    info.random = ConsumesRandomness(op);
    info.type = OpTypeName(op.operator_name());
    info.type_id = policy_.TypeId(info.type);
    for (const c10::Argument& ret : schema.returns()) {
      if (ret.alias_info() != nullptr && !ret.alias_info()->isWrite()) info.returns_view = true;
    }
    if (schema.name() == "aten::set_") info.returns_view = true;
    info.inplace_view = IsInplaceView(op);  // NOTE [In-place view ops]
    info.nested_watched = WriteWatchCovers(op);
    info.uninitialized = Uninitialized(schema.name());
  }
  return it->second;
}

void Recorder::OnOp(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                    torch::jit::Stack* stack) {
  if (progress_.inert) {
    // NOTE [Capture failures]: after a failure the model just runs.
    NoCapture hide_nested(kCaptureKey);
    op.redispatchBoxed(keys & kBelowCaptureKey, stack);
    return;
  }
  if (progress_.depth > 0) {
    OnNestedOp(op, keys, stack);
  } else {
    OnUserOp(op, keys, stack);
  }
}

void Recorder::OnUserOp(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                        torch::jit::Stack* stack) {
  ++record_.record().stats.user_ops;
  NodeRecord node = record_.BeginOp();
  PreparedOp prepared;
  // NOTE [Capture failures]: the capture's own failures (out of memory while saving) end
  // the capture, never the model's forward pass.
  try {
    prepared = Prepare(op, stack, &node);
  } catch (const std::exception& e) {
    record_.DropArguments(node);
    Abandon(e);
    DepthGuard depth(&progress_.depth);
    NoCapture hide_nested(kCaptureKey);
    op.redispatchBoxed(keys & kBelowCaptureKey, stack);
    return;
  }
  if (prepared.halt_before) {
    record_.DropArguments(node);
    Halt(static_cast<int32_t>(record_.record().nodes.size()) - 1,
         absl::StrCat("the forward was halted when module '", options_.halt_after,
                      "' had finished (CaptureOptions::halt_after); the trace ends at {label}"));
  }

  const int64_t start_ns = options_.time_ops ? NowNs() : 0;
  try {
    DepthGuard depth(&progress_.depth);
    if (prepared.observe_nested && prepared.nested_watched) {
      // See NOTE [Watching nested writes] in write_watch.h.
      NoCapture hide_nested(kCaptureKey);
      c10::impl::IncludeDispatchKeyGuard watch_writes(kWriteWatchKey);
      op.redispatchBoxed(keys & kBelowCaptureKey, stack);
    } else if (prepared.observe_nested) {
      op.redispatchBoxed(keys & kBelowCaptureKey, stack);
    } else {
      NoCapture hide_nested(kCaptureKey);
      op.redispatchBoxed(keys & kBelowCaptureKey, stack);
    }
  } catch (const std::exception& e) {
    record_.DropArguments(node);
    journal_.DropPendingWrites();
    index_.overwritten().clear();
    if (index_.has_moved_aliases()) index_.IndexMovedAliases();
    if (progress_.failure.ok()) {
      progress_.failure = absl::AbortedError(absl::StrCat(
          "the forward pass threw while capturing (", op.operator_name().name, ": ", FirstLine(e),
          "); the trace would be incomplete. Fix the error and capture again"));
    }
    throw;
  }

  const int64_t end_ns = options_.time_ops ? NowNs() : 0;
  int32_t index = -1;
  try {
    index = Record(node, prepared, stack);
    if (options_.time_ops) record_.record().timings.push_back(OpTiming{index, start_ns, end_ns});
  } catch (const std::exception& e) {
    Abandon(e);
    return;
  }
  if (prepared.halt_after) {
    Halt(index, "the forward was halted right after {label} (CaptureOptions::halt_after)");
  }
  if (options_.stop_at_non_finite &&
      ReturnsNonFinite(torch::jit::last(*stack, prepared.num_returns))) {
    Halt(index,
         "the forward was halted at {label}, the first op whose output holds NaN or Inf "
         "(CaptureOptions::stop_at_non_finite)");
  }
}

Recorder::PreparedOp Recorder::Prepare(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                                       NodeRecord* node) {
  NoCapture no_capture(kCaptureKey);
  // See NOTE [Streaming memory written without dispatch].
  if (C10_UNLIKELY(record_.has_deferred_values())) record_.StreamDeferredValues();
  PreparedOp prepared;
  const OpInfo* info = &Info(op);
  if (journal_.has_assigned_buffers()) journal_.CheckAssigned();
  const c10::ArrayRef<c10::IValue> args = torch::jit::last(*stack, info->num_arguments);
  absl::InlinedVector<SourceRecord, 4> sources;
  for (const c10::IValue& arg : args) {
    ForEachTensor(arg, [&](const at::Tensor& tensor) {
      sources.push_back(Resolve(tensor, &prepared.touches_buffer, &prepared.owner_module));
    });
  }
  prepared.symbol = info->symbol;
  Identify(*info, node, &prepared);
  if (prepared.halt_before) return prepared;
  if (policy_.selective() && prepared.save) {
    // An argument whose producer was not saved (NOTE [Selective saving]) is saved now,
    // its value as this op reads it.
    size_t s = 0;
    for (const c10::IValue& arg : args) {
      ForEachTensor(arg, [&](const at::Tensor& tensor) {
        SourceRecord& source = sources[s++];
        // A parameter is read by reference (NOTE [Parameters read by reference]).
        if (source.slot >= 0 || source.kind == SourceRecord::Kind::kParam || !tensor.defined()) {
          return;
        }
        source.slot = Save(tensor);
        if (TensorEntry* entry = Lookup(tensor.unsafeGetTensorImpl())) {
          entry->slot = source.slot;
          Pin(tensor, entry);  // a detached alias saved (NOTE [Address reuse in unsaved mode])
        }
      });
    }
  }
  if (prepared.save && !policy_.streaming()) {
    for (const c10::IValue& arg : args) {
      // Lists are shared and mutable: TorchScript code may append to one after the call
      // (DenseNet appends to the list it passed to aten::cat). Keep the call's contents.
      record_.AddArgument(arg.isList() ? c10::IValue(arg.toList().copy()) : arg);
    }
  } else if (prepared.save) {
    // NOTE [Streaming without saving]: an argument a node produced is that node's streamed
    // value; holding the tensor would keep every activation alive.
    size_t s = 0;
    for (const c10::IValue& arg : args) {
      if (!ContainsTensor(arg)) {
        record_.AddArgument(arg.isList() ? c10::IValue(arg.toList().copy()) : arg);
        continue;
      }
      record_.AddArgument(MapTensors(arg, [&](const at::Tensor& t) {
        return sources[s++].kind == SourceRecord::Kind::kNode ? at::Tensor() : t;
      }));
    }
  }
  record_.EndArguments(node, sources);
  journal_.DropPendingWrites();
  index_.overwritten().clear();
  if (index_.has_moved_aliases()) index_.IndexMovedAliases();
  if (!info->written_arguments.empty()) {
    // Written arguments are named by their tensor index, the position of their source.
    int32_t tensor_index = 0;
    size_t next_written = 0;  // written_arguments is in argument order
    for (uint32_t a = 0; a < args.size(); ++a) {
      const bool written = next_written < info->written_arguments.size() &&
                           info->written_arguments[next_written] == a;
      if (written) ++next_written;
      ForEachTensor(args[a], [&](const at::Tensor& t) {
        if (written && info->inplace_view) {
          PrepareInplaceView(t, tensor_index);
        } else if (written) {
          PrepareWrite(t, WriteKind::kInplace, tensor_index);
        }
        ++tensor_index;
      });
    }
  }
  const bool fused = info->fused != nullptr && UpdatesState(*info->fused, args);
  if (fused) {
    for (int s = 0; s < info->fused->num_state_arguments; ++s) {
      ForEachTensor(args[info->fused->state_arguments[s]],
                    [&](const at::Tensor& t) { PrepareWrite(t, WriteKind::kFused, -1); });
    }
  }
  // Nested ops are observed for writes to a buffer the op reads without declaring them
  // (NOTE [Buffer writes]). A listed fused mutator's only such writes are its state
  // arguments, known from its update flag: one that does not update them (BatchNorm in
  // eval mode, which reads the running statistics) has nothing to observe, and observing
  // its decomposition cost every eval-mode BatchNorm a boxed call per nested op.
  prepared.observe_nested =
      fused || (prepared.touches_buffer && info->fused == nullptr && !info->inplace_view);
  prepared.nested_watched = info->nested_watched;
  if (info->random && prepared.save) {
    // Replay draws the same numbers from this state (validation/replay.h).
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(generator.mutex());
    node->rng_slot = record_.AddSlot(generator.get_state());  // a private copy
  }
  // Copied out: nested calls may add to op_infos_ and move `*info`.
  prepared.op_index = info->index;
  prepared.num_returns = info->num_returns;
  prepared.uninitialized = info->uninitialized;
  if (info->returns_view && !prepared.save) {
    // Its values are not kept, with or without saved values (a selective capture, or one
    // over its budget): the aliases are indexed as without saved values.
    for (const c10::IValue& arg : args) {
      ForEachTensor(arg, [&](const at::Tensor& t) {
        if (t.defined() && t.has_storage()) prepared.view_bases.push_back(t);
      });
    }
  }
  return prepared;
}

void Recorder::Identify(const OpInfo& info, NodeRecord* node, PreparedOp* prepared) {
  CaptureRecord& record = record_.record();
  const OpPlacement::Place place = placement_.Locate(
      info.symbol, info.index, prepared->owner_module, &record.source_position_owners);
  node->module = place.module;
  node->op = info.index;
  node->layer = place.layer;
  if (place.new_layer) {
    // Layer ids are numbered in order of first use, so this appends one.
    record.layer_positions.resize(node->layer, nullptr);
    record.layer_positions.push_back(place.first_position);  // NOTE [Source positions]
  }
  const SavePolicy::Decision decision =
      policy_.Decide(info.type, info.type_id, record.operators[info.index].name, place, placement_);
  prepared->save = decision.save;
  prepared->halt_before = decision.halt_before;
  prepared->halt_after = decision.halt_after;
}

int32_t Recorder::Record(NodeRecord node, const PreparedOp& prepared, torch::jit::Stack* stack) {
  NoCapture no_capture(kCaptureKey);
  record_.PrefetchAhead();
  const int32_t index = record_.AddOp(node);
  if (C10_UNLIKELY(prepared.uninitialized)) record_.DeferStreaming(true);
  if (policy_.over_budget() && record_.record().partial_node < 0) {
    record_.record().partial_node = index;
  }
  const c10::ArrayRef<c10::IValue> returns = torch::jit::last(*stack, prepared.num_returns);
  int32_t output_index = 0;
  for (const c10::IValue& value : returns) {
    ForEachTensor(value, [&](const at::Tensor& tensor) {
      RecordOpOutput(index, output_index++, tensor, prepared.touches_buffer, prepared.save);
    });
  }
  if (C10_UNLIKELY(prepared.uninitialized)) record_.DeferStreaming(false);
  if (!prepared.view_bases.empty()) {
    for (const c10::IValue& value : returns) {
      ForEachTensor(
          value, [&](const at::Tensor& view) { index_.IndexAliases(view, prepared.view_bases); });
    }
  }
  if (journal_.has_pending_writes()) journal_.CommitWrites(index, returns);
  if (!index_.overwritten().empty()) RecordAliasWrites(index);
  if (index_.has_moved_aliases()) index_.IndexMovedAliases();
  return index;
}

void Recorder::OnNestedOp(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                          torch::jit::Stack* stack) {
  const OpInfo& info = Info(op);
  // A kernel's own in-place view ops write no bytes (NOTE [In-place view ops]).
  if (!info.written_arguments.empty() && !info.inplace_view) PrepareNestedWrites(info, *stack);
  DepthGuard depth(&progress_.depth);
  op.redispatchBoxed(keys & kBelowCaptureKey, stack);
}

void Recorder::OnNestedWrite(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (progress_.inert) return;
  // A copy-on-write clone dispatches a write of its own: neither key may see it.
  c10::impl::ExcludeDispatchKeyGuard unwatched(c10::DispatchKeySet({kCaptureKey, kWriteWatchKey}));
  const OpInfo& info = Info(op);
  if (!info.inplace_view) PrepareNestedWrites(info, *stack);  // NOTE [In-place view ops]
}

void Recorder::PrepareNestedWrites(const OpInfo& info, const torch::jit::Stack& stack) {
  ++record_.record().stats.nested_ops;
  NoCapture no_capture(kCaptureKey);
  const c10::ArrayRef<c10::IValue> args = torch::jit::last(stack, info.num_arguments);
  for (uint32_t a : info.written_arguments) {
    // A write the user-level op did not declare: see NOTE [Buffer writes].
    ForEachTensor(args[a], [&](const at::Tensor& t) { PrepareWrite(t, WriteKind::kFused, -1); });
  }
}

bool Recorder::Stale(const TensorEntry& entry, const c10::TensorImpl* impl) const {
  // See NOTE [Address reuse in unsaved mode]. A streaming capture's entries pin their
  // tensors' addresses (NOTE [Streaming identity]): a dead tensor's entry stays.
  if (policy_.streaming()) return false;
  return (entry.version.enabled() &&
          CounterOf(entry.version) != CounterOf(impl->version_counter())) ||
         (entry.alive.has_value() && entry.alive->expired());
}

Recorder::TensorEntry* Recorder::Lookup(const c10::TensorImpl* impl) {
  auto it = tensors_.find(impl);
  if (it == tensors_.end()) return nullptr;
  if (Stale(it->second, impl)) {
    tensors_.erase(it);  // a new tensor at a freed tensor's address
    return nullptr;
  }
  return &it->second;
}

Recorder::TensorEntry* Recorder::Find(const c10::TensorImpl* impl, bool pinned) {
  if (!pinned) return Lookup(impl);
  auto it = tensors_.find(impl);
  return it == tensors_.end() ? nullptr : &it->second;
}

void Recorder::Pin(const at::Tensor& tensor, TensorEntry* entry) {
  if (entry->param >= 0 || entry->buffer >= 0) return;
  if (policy_.streaming()) {
    entry->alive.emplace(tensor.getIntrusivePtr());  // NOTE [Streaming identity]
  } else if (entry->slot >= 0 && record_.record().slots[entry->slot].unsafeGetTensorImpl() !=
                                     tensor.unsafeGetTensorImpl()) {
    // Saved as a detached alias: the address stays the tensor's, as if the saved value held
    // it (NOTE [Address reuse in unsaved mode]).
    entry->alive.emplace(tensor.getIntrusivePtr());
  } else if (entry->slot < 0) {
    // See NOTE [Address reuse in unsaved mode]: no saved value holds this TensorImpl.
    const c10::VariableVersion& version = tensor.unsafeGetTensorImpl()->version_counter();
    if (version.enabled()) {
      entry->version = version;
    } else {
      entry->alive.emplace(tensor.getIntrusivePtr());
    }
  }
}

void Recorder::Remember(const at::Tensor& tensor, TensorEntry entry) {
  Pin(tensor, &entry);
  tensors_.insert_or_assign(tensor.unsafeGetTensorImpl(), std::move(entry));
}

SourceRecord Recorder::Resolve(const at::Tensor& tensor, bool* touches_buffer,
                               int32_t* owner_module) {
  SourceRecord source;
  if (!tensor.defined()) return source;  // kNone
  const c10::TensorImpl* impl = tensor.unsafeGetTensorImpl();
  if (impl->is_wrapped_number()) {
    // A Python number passed where the schema takes a tensor (`x * 2` calls mul.Tensor
    // with a 0-dim "wrapped number"): an argument value, as a Scalar argument is, not a
    // node. It is made anew for each call and never written.
    source.kind = SourceRecord::Kind::kConstant;
    return source;
  }
  TensorEntry* entry = Lookup(impl);
  if (entry == nullptr) entry = AddUnseen(tensor);
  if (entry->aliases_buffer) *touches_buffer = true;
  // NOTE [Tensor identity]: the registered tensor, and a tensor made without dispatching
  // in its place (NOTE [Buffer writes]), read the buffer's current version.
  if (const int32_t buffer = entry->buffer >= 0 ? entry->buffer : entry->buffer_view; buffer >= 0) {
    if (*owner_module < 0) *owner_module = layout_->buffers[buffer].module;
    const int32_t version = journal_.Read(buffer);
    source.kind = SourceRecord::Kind::kNode;
    source.index = version;
    source.slot = record_.OutputSlot(version);
    return source;
  }
  ReadFormerBuffer(entry);
  if (entry->param >= 0) {
    if (*owner_module < 0) *owner_module = layout_->param_modules[entry->param];
    source.kind = SourceRecord::Kind::kParam;
    source.index = entry->param;
  } else if (entry->node >= 0) {
    source.kind = SourceRecord::Kind::kNode;
    source.index = entry->node;
    source.output_index = entry->output_index;
  } else {
    source.kind = SourceRecord::Kind::kConstant;
  }
  source.slot = entry->slot;
  return source;
}

namespace {
// See FailSavesAfterForTesting (testing.h).
thread_local int saves_until_failure = -1;
}  // namespace

void FailSavesAfterForTesting(int saves) { saves_until_failure = saves; }

int32_t Recorder::Save(const at::Tensor& tensor, const c10::TensorImpl* live) {
  if (C10_UNLIKELY(saves_until_failure >= 0) && saves_until_failure-- == 0) {
    throw std::bad_alloc();
  }
  if (policy_.streaming()) return SaveStreamed(tensor, live);
  // Saved values never hold the user's autograd graph alive.
  const int32_t slot = record_.AddSlot(tensor.requires_grad() ? DetachedAlias(tensor) : tensor);
  policy_.CountSaved(tensor);
  if (tensor.has_storage()) {
    // NOTE [Saved values indexed when a write needs them].
    index_.unindexed().push_back(
        {tensor.storage().unsafeGetStorageImpl(),
         SavedValue{slot, live != nullptr ? live : tensor.unsafeGetTensorImpl()}});
  }
  return slot;
}

void Recorder::RecordOpOutput(int32_t node, int32_t output_index, const at::Tensor& tensor,
                              bool touches_buffer, bool save) {
  const int32_t slot = save && tensor.defined() ? Save(tensor) : -1;
  if (slot >= 0) {
    if (slot >= static_cast<int32_t>(index_.slot_producers().size())) {
      index_.slot_producers().resize(record_.num_slots(), {-1, 0});
    }
    index_.slot_producers()[slot] = {node, output_index};
  }
  record_.AddOutput(node, tensor, slot);
  if (!tensor.defined()) return;
  // One probe of the table, which the forward evicts between ops: an op's output is
  // mostly a tensor it has not seen, and its entry is made where the probe ended.
  const c10::TensorImpl* impl = tensor.unsafeGetTensorImpl();
  auto [it, inserted] = tensors_.try_emplace(impl);
  TensorEntry& entry = it->second;
  if (!inserted && Stale(entry, impl)) {
    entry = TensorEntry();  // a new tensor at a freed tensor's address
    inserted = true;
  }
  if (!inserted && (entry.buffer >= 0 || entry.buffer_view >= 0)) {
    // The op returned the registered buffer itself (an in-place write): its new version,
    // committed next, becomes the producer. See NOTE [Tensor identity].
    return;
  }
  const bool was_saved = entry.slot >= 0;
  entry.node = node;
  entry.output_index = output_index;
  entry.slot = slot;
  entry.param = -1;  // a parameter written in place is now this op's output
  entry.former_buffer = -1;
  if (!inserted) {
    // An in-place op's output: it keeps its pins and aliasing. Its value saved before no
    // longer indexes it; when this one is not saved, later writes through its views find
    // it among the aliases (NOTE [Writes through views]).
    if (was_saved && slot < 0 && tensor.has_storage()) {
      StorageEntry* storage = nullptr;
      index_.IndexAlias(tensor, tensor.storage().unsafeGetStorageImpl(), &storage);
    }
    return;
  }
  if (touches_buffer) entry.aliases_buffer = AliasesBuffer(tensor);
  Pin(tensor, &entry);
}

}  // namespace torchlens
