#include "torchlens_dispatch/recorder.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/isfinite.h>
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
      module_addresses_(ModuleTree{layout_->serial, layout_->module_addresses, &layout_->module_ids,
                                   &layout_->module_types, &layout_->module_children,
                                   &layout_->layer_classes}),
      script_sites_(&module_addresses_),
      streaming_(!options_.save_activations && options_.value_sink != nullptr),
      saves_(options_.save_activations || streaming_),
      journal_(*layout_, &record_, this, options_.save_activations) {
  NoCapture no_capture(kCaptureKey);
  if (options_.value_sink) record_.SetValueSink(&options_.value_sink, streaming_);
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
  storages_.reserve(last.storages.load(kRelaxed));
  unindexed_values_.reserve(last.slots.load(kRelaxed));
  layers_.reserve(last.layers.load(kRelaxed));
  record.layer_positions.reserve(last.layers.load(kRelaxed));
  layer_of_class_.assign(last.layer_classes.load(kRelaxed), -1);
  record_.Reserve(last);
  // See NOTE [Selective saving].
  selective_ = options_.save_activations &&
               (!options_.save_modules.empty() || !options_.save_types.empty() ||
                !options_.save_labels.empty() || options_.save_if != nullptr);
  if (options_.halt_after.find(':') != std::string::npos) {
    halt_label_ = options_.halt_after;
  } else if (!options_.halt_after.empty()) {
    auto it = layout_->module_ids.find(options_.halt_after);
    if (it != layout_->module_ids.end()) halt_module_ = it->second;
  }
  for (const std::string& address : options_.save_modules) {
    auto it = layout_->module_ids.find(address);
    if (it != layout_->module_ids.end()) save_module_ids_.push_back(it->second);
  }
  may_halt_ = !options_.halt_after.empty() || options_.stop_at_non_finite;
  labels_needed_ = !halt_label_.empty() ||
                   (selective_ && (!options_.save_labels.empty() || options_.save_if != nullptr));
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
    if (labels_needed_) info.type_id = numbering_.TypeId(info.type);
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
  if (inert_) {
    // NOTE [Capture failures]: after a failure the model just runs.
    NoCapture hide_nested(kCaptureKey);
    op.redispatchBoxed(keys & kBelowCaptureKey, stack);
    return;
  }
  if (depth_ > 0) {
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
    DepthGuard depth(&depth_);
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
    DepthGuard depth(&depth_);
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
    overwritten_.clear();
    if (!moved_aliases_.empty()) IndexMovedAliases();
    if (failure_.ok()) {
      failure_ = absl::AbortedError(absl::StrCat(
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
  if (selective_ && prepared.save) {
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
  if (prepared.save && !streaming_) {
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
  overwritten_.clear();
  if (!moved_aliases_.empty()) IndexMovedAliases();
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
  const ScriptSite site = layout_->torchscript ? script_sites_.Current(info.symbol)
                          : layout_->eager     ? EagerSite()
                                               : ScriptSite{};
  node->module =
      site.in_script || layout_->eager ? site.module : std::max<int32_t>(prepared->owner_module, 0);
  if (site.in_script && site.unknown_instance && prepared->owner_module >= 0 &&
      IsWithin(prepared->owner_module, site.module)) {
    // TorchScript could not name the submodule (a ModuleList iterated in a loop): the
    // module owning the parameters or buffers the op reads names it.
    node->module = prepared->owner_module;
  }
  node->op = info.index;
  node->layer = LayerOf(node->module, info.index, site);
  CaptureRecord& record = record_.record();
  if (static_cast<size_t>(node->layer) >= record.layer_positions.size()) {  // its first op
    // Layer ids are numbered in order of first use, so this appends one.
    record.layer_positions.resize(node->layer, nullptr);
    record.layer_positions.push_back(  // NOTE [Source positions]
        script_sites_.PositionOf(site, &record.source_position_owners));
  }
  prepared->save = saves_ && !over_budget_;
  if (options_.max_saved_bytes >= 0 && saved_bytes_ > options_.max_saved_bytes && prepared->save) {
    over_budget_ = true;  // NOTE [Selective saving]: from here on, metadata only
    prepared->save = false;
  }
  if (halt_module_ >= 0) {
    const bool inside = node->module == halt_module_ || IsWithin(node->module, halt_module_);
    if (inside) halt_module_entered_ = true;
    prepared->halt_before = !inside && halt_module_entered_;
  }
  if (!labels_needed_ && !selective_) return;
  std::string label;
  if (labels_needed_) {
    const LayerNumbering::Numbers numbers = numbering_.Next(node->layer, info.type_id);
    label = LayerPassLabel(info.type, numbers.type_index, numbers.step_index, numbers.pass);
    prepared->halt_after = label == halt_label_;
  }
  if (!selective_ || !prepared->save) return;
  // See NOTE [Selective saving].
  prepared->save =
      std::any_of(save_module_ids_.begin(), save_module_ids_.end(),
                  [&](int32_t id) { return node->module == id || IsWithin(node->module, id); }) ||
      std::find(options_.save_types.begin(), options_.save_types.end(), info.type) !=
          options_.save_types.end() ||
      std::find(options_.save_labels.begin(), options_.save_labels.end(), label) !=
          options_.save_labels.end() ||
      (options_.save_if != nullptr &&
       options_.save_if(OpQuery{label, info.type, module_addresses_.Address(node->module),
                                record_.record().operators[info.index].name}));
}

bool Recorder::ReturnsNonFinite(c10::ArrayRef<c10::IValue> returns) {
  NoCapture no_capture(kCaptureKey);
  bool non_finite = false;
  for (const c10::IValue& value : returns) {
    ForEachTensor(value, [&](const at::Tensor& t) {
      if (non_finite || !t.defined() || t.layout() != at::kStrided || t.numel() == 0 ||
          !(t.is_floating_point() || t.is_complex())) {
        return;
      }
      non_finite = !at::isfinite(t).all().item<bool>();
    });
  }
  return non_finite;
}

void Recorder::Halt(int32_t node, std::string reason) {
  // The forward stops here: the model's buffers and written parameters go back to their
  // values before it, and the capture records nothing more.
  NoCapture no_capture(kCaptureKey);
  halted_ = true;
  inert_ = true;
  // Saved values that alias a buffer or a written parameter (an in-place op's output is
  // the tensor itself) keep what the forward computed; the restores below would otherwise
  // write them too.
  CopySavedValuesOfModelState(journal_.InitialStorages());
  journal_.RestoreInitialState();
  RestoreWrittenParameters();
  CaptureRecord& record = record_.record();
  record.partial_node = node;
  record.partial_reason = std::move(reason);
  throw CaptureHalted(
      "torchlens: the capture halted the forward (CaptureOptions::halt_after "
      "or stop_at_non_finite)");
}

int32_t Recorder::Record(NodeRecord node, const PreparedOp& prepared, torch::jit::Stack* stack) {
  NoCapture no_capture(kCaptureKey);
  record_.PrefetchAhead();
  const int32_t index = record_.AddOp(node);
  if (C10_UNLIKELY(prepared.uninitialized)) record_.DeferStreaming(true);
  if (over_budget_ && record_.record().partial_node < 0) record_.record().partial_node = index;
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
      ForEachTensor(value,
                    [&](const at::Tensor& view) { IndexAliases(view, prepared.view_bases); });
    }
  }
  if (journal_.has_pending_writes()) journal_.CommitWrites(index, returns);
  if (!overwritten_.empty()) RecordAliasWrites(index);
  if (!moved_aliases_.empty()) IndexMovedAliases();
  return index;
}

void Recorder::Abandon(const std::exception& e) {
  journal_.DropPendingWrites();
  overwritten_.clear();
  moved_aliases_.clear();
  inert_ = true;
  if (!failure_.ok()) return;
  const bool memory = IsOutOfMemory(e);
  const std::string message = absl::StrCat(
      memory ? "out of memory while saving values during capture (" : "capture failed (",
      FirstLine(e),
      "); the forward pass was not affected but the trace is incomplete and was dropped. ",
      memory ? "Free memory, or capture with CaptureOptions::save_activations = false"
             : "Report this with the model that triggers it");
  failure_ = memory ? absl::ResourceExhaustedError(message) : absl::InternalError(message);
}

void Recorder::OnNestedOp(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                          torch::jit::Stack* stack) {
  const OpInfo& info = Info(op);
  // A kernel's own in-place view ops write no bytes (NOTE [In-place view ops]).
  if (!info.written_arguments.empty() && !info.inplace_view) PrepareNestedWrites(info, *stack);
  DepthGuard depth(&depth_);
  op.redispatchBoxed(keys & kBelowCaptureKey, stack);
}

void Recorder::OnNestedWrite(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (inert_) return;
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
  if (streaming_) return false;
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
  if (streaming_) {
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

int32_t Recorder::ParamId(const c10::TensorImpl* impl) {
  // See ModelLayout::param_order.
  const std::vector<std::pair<const c10::TensorImpl*, int32_t>>& order = layout_->param_order;
  if (next_param_ < order.size() && order[next_param_].first == impl) {
    // The parameters expected 16 reads ahead, and their modules (ids follow the order but
    // for tied parameters): both arrays are cold when a capture starts, and sequential
    // reads spaced a whole op apart are too sparse for the hardware to see (NOTE [Cold
    // record memory]).
    const size_t ahead = std::min(next_param_ + 16, order.size() - 1);
    __builtin_prefetch(&order[ahead]);
    __builtin_prefetch(&layout_->param_modules[ahead]);
    return order[next_param_++].second;
  }
  auto it = layout_->param_ids.find(impl);
  if (it == layout_->param_ids.end()) return -1;
  next_param_ = static_cast<size_t>(it->second) + 1;
  return it->second;
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
  if (streaming_) return SaveStreamed(tensor, live);
  // Saved values never hold the user's autograd graph alive.
  const int32_t slot = record_.AddSlot(tensor.requires_grad() ? DetachedAlias(tensor) : tensor);
  if (options_.max_saved_bytes >= 0) saved_bytes_ += static_cast<int64_t>(tensor.nbytes());
  if (tensor.has_storage()) {
    // NOTE [Saved values indexed when a write needs them].
    unindexed_values_.push_back(
        {tensor.storage().unsafeGetStorageImpl(),
         SavedValue{slot, live != nullptr ? live : tensor.unsafeGetTensorImpl()}});
  }
  return slot;
}

void Recorder::IndexSavedValues() {
  for (const UnindexedValue& value : unindexed_values_) {
    storages_[value.storage].saved.push_back(value.saved);
  }
  unindexed_values_.clear();
}

void Recorder::RecordOpOutput(int32_t node, int32_t output_index, const at::Tensor& tensor,
                              bool touches_buffer, bool save) {
  const int32_t slot = save && tensor.defined() ? Save(tensor) : -1;
  if (slot >= 0) {
    if (slot >= static_cast<int32_t>(slot_producers_.size())) {
      slot_producers_.resize(record_.num_slots(), {-1, 0});
    }
    slot_producers_[slot] = {node, output_index};
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
      IndexAlias(tensor, tensor.storage().unsafeGetStorageImpl(), &storage);
    }
    return;
  }
  if (touches_buffer) entry.aliases_buffer = AliasesBuffer(tensor);
  Pin(tensor, &entry);
}

bool Recorder::IsWithin(int32_t inner, int32_t outer) {
  if (outer == 0) return true;
  // Modules interned during the capture (ModuleAddresses' extra ones) have addresses too.
  const std::string& a = module_addresses_.Address(inner);
  const std::string& b = module_addresses_.Address(outer);
  return a.size() > b.size() && a.compare(0, b.size(), b) == 0 && a[b.size()] == '.';
}

ScriptSite Recorder::EagerSite() {
  ScriptSite site;
  if (!open_calls_.empty()) {
    OpenCall& call = open_calls_.back();
    site.module = call.module;
    site.position = ++call.ops;
  }
  return site;
}

bool Recorder::EnterModule(const void* module) {
  auto it = layout_->eager_module_ids.find(module);
  if (it == layout_->eager_module_ids.end()) return false;
  // A module's forward calling its own forward again (`super().forward(x)` through a
  // patched base class) continues the call it is in.
  if (!open_calls_.empty() && open_calls_.back().module == it->second) return false;
  open_calls_.push_back(OpenCall{it->second, 0});
  return true;
}

void Recorder::ExitModule() {
  if (!open_calls_.empty()) open_calls_.pop_back();
}

int32_t Recorder::LayerOf(int32_t module, int32_t op_index, const ScriptSite& site) {
  // See NOTE [Layers and passes].
  if (!site.in_script && module == 0) return next_layer_++;
  if (site.layer_class >= 0 && module == site.module) {
    // See NOTE [Layer classes].
    const size_t number = static_cast<size_t>(site.layer_class);
    if (number >= layer_of_class_.size()) {
      layer_of_class_.resize(std::max(number + 1, 2 * layer_of_class_.size()), -1);
    }
    int32_t& layer = layer_of_class_[number];
    if (layer < 0) layer = next_layer_++;
    return layer;
  }
  const LayerKey key{module, op_index, site.in_script || layout_->eager ? site.position : 0};
  auto [it, inserted] = layers_.try_emplace(key, next_layer_);
  if (inserted) ++next_layer_;
  return it->second;
}

}  // namespace torchlens
