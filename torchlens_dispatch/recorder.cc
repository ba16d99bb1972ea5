#include "torchlens_dispatch/recorder.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/clone.h>
#include <ATen/ops/equal.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "torchlens_dispatch/ops/ivalue_tensors.h"
#include "torchlens_dispatch/ops/capture_key.h"
#include "torchlens_dispatch/ops/bit_identical.h"
#include "torchlens_dispatch/ops/exception_text.h"
#include "torchlens_dispatch/ops/randomness.h"
#include "torchlens_dispatch/saved_copy.h"
#include "torchlens_dispatch/testing.h"

namespace torchlens {
namespace {

// The capturing recorder of this thread. See NOTE [User-level and nested ops].
thread_local Recorder* current_recorder = nullptr;

// Runs the recorder's own tensor operations (clones, comparisons, detach) without
// capturing them.
using NoCapture = c10::impl::ExcludeDispatchKeyGuard;

class DepthGuard {
 public:
  explicit DepthGuard(int* depth) : depth_(depth) { ++*depth_; }
  ~DepthGuard() { --*depth_; }
  DepthGuard(const DepthGuard&) = delete;
  DepthGuard& operator=(const DepthGuard&) = delete;

 private:
  int* depth_;
};

// Byte range [begin, end) that `tensor` can touch in its storage.
std::pair<int64_t, int64_t> ByteRange(const at::Tensor& tensor) {
  const int64_t item = static_cast<int64_t>(tensor.element_size());
  const int64_t begin = tensor.storage_offset() * item;
  if (tensor.numel() == 0) return {begin, begin};
  int64_t last = 0;
  for (int64_t d = 0; d < tensor.dim(); ++d) {
    last += (tensor.size(d) - 1) * std::abs(tensor.stride(d));
  }
  return {begin, begin + (last + 1) * item};
}

bool Overlap(std::pair<int64_t, int64_t> a, std::pair<int64_t, int64_t> b) {
  return a.first < b.second && b.first < a.second;
}

TensorGeometry GeometryOf(const at::Tensor& tensor) {
  return TensorGeometry{tensor.sizes().vec(), tensor.strides().vec(), tensor.storage_offset()};
}

// Whether `a` and `b` lie in the same place of the same storage, as the same dtype.
bool SamePlace(const at::Tensor& a, const at::Tensor& b) {
  return a.has_storage() && b.has_storage() && a.storage().is_alias_of(b.storage()) &&
         a.storage_offset() == b.storage_offset() && a.sizes() == b.sizes() &&
         a.strides() == b.strides() && a.scalar_type() == b.scalar_type();
}

at::Tensor Snapshot(const at::Tensor& tensor) { return tensor.detach().clone(); }

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
      module_addresses_(ModuleTree{layout_->serial, layout_->module_addresses,
                                   &layout_->module_ids, &layout_->module_types,
                                   &layout_->module_children, &layout_->layer_classes}),
      script_sites_(&module_addresses_) {
  NoCapture no_capture(kCaptureKey);
  record_.saved_values = options_.save_activations;
  record_.training = training;
  record_.module_addresses = layout_->module_addresses;
  record_.param_addresses = layout_->param_addresses;
  record_.modules = layout_->trace_modules;
  record_.params = layout_->trace_params;
  const ModelLayout::CaptureSizes& last = layout_->last_capture_sizes;
  constexpr auto kRelaxed = std::memory_order_relaxed;
  tensors_.reserve(last.tensors.load(kRelaxed));
  storages_.reserve(last.storages.load(kRelaxed));
  layers_.reserve(last.layers.load(kRelaxed));
  layer_of_class_.assign(last.layer_classes.load(kRelaxed), -1);
  record_.nodes.reserve(last.nodes.load(kRelaxed));
  record_.args.reserve(last.args.load(kRelaxed));
  record_.sources.reserve(last.sources.load(kRelaxed));
  record_.outputs.reserve(last.outputs.load(kRelaxed));
  record_.shapes.reserve(last.shapes.load(kRelaxed));
  if (options_.save_activations) record_.slots.reserve(last.slots.load(kRelaxed));
  // Parameters are recognised on first use (AddUnseen), not registered one by one here:
  // see NOTE [Model layouts].
  for (const ModelLayout::AttributeEntry& attribute : layout_->tensor_attributes) {
    const c10::IValue& value = attribute.owner->getSlot(attribute.slot);
    if (!value.isTensor()) continue;
    attributes_.emplace(value.unsafeToTensorImpl(),
                        static_cast<int32_t>(record_.constant_addresses.size()));
    record_.constant_addresses.push_back(attribute.address);
  }
  buffers_.resize(layout_->buffers.size());
  for (size_t i = 0; i < layout_->buffers.size(); ++i) {
    const ModelLayout::BufferEntry& entry = layout_->buffers[i];
    BufferState& buffer = buffers_[i];
    buffer.entry = &entry;
    const at::Tensor tensor = CurrentBuffer(entry);
    if (tensor.defined()) buffer.latest = Snapshot(tensor);
    record_.buffers.push_back(BufferRecord{entry.address, entry.module, buffer.latest});
    if (!tensor.defined()) continue;  // a slot holding None
    SetHolder(static_cast<int32_t>(i), tensor);
    if (entry.assigned_in_code) assigned_buffers_.push_back(static_cast<int32_t>(i));
  }
}

const Recorder::OpInfo& Recorder::Info(const c10::OperatorHandle& op) {
  const c10::FunctionSchema& schema = op.schema();
  auto [it, inserted] = op_infos_.try_emplace(&schema);
  if (inserted) {
    OpInfo& info = it->second;
    info.index = static_cast<int32_t>(record_.operators.size());
    record_.operators.push_back(op.operator_name());
    info.num_arguments = static_cast<uint32_t>(schema.arguments().size());
    info.num_returns = static_cast<uint32_t>(schema.returns().size());
    for (uint32_t a = 0; a < info.num_arguments; ++a) {
      const c10::AliasInfo* alias = schema.arguments()[a].alias_info();
      if (alias != nullptr && alias->isWrite()) info.written_arguments.push_back(a);
    }
    info.fused = FindFusedMutator(schema.name());
    info.symbol = c10::Symbol::fromQualString(schema.name());
    info.random = ConsumesRandomness(op);
    for (const c10::Argument& ret : schema.returns()) {
      if (ret.alias_info() != nullptr && !ret.alias_info()->isWrite()) info.returns_view = true;
    }
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
  ++record_.stats.user_ops;
  const size_t args_mark = record_.args.size();
  const size_t sources_mark = record_.sources.size();
  NodeRecord node;
  node.kind = NodeRecord::Kind::kOp;
  PreparedOp prepared;
  // NOTE [Capture failures]: the capture's own failures (out of memory while saving) end
  // the capture, never the model's forward pass.
  try {
    prepared = Prepare(op, stack, &node);
  } catch (const std::exception& e) {
    record_.args.resize(args_mark);
    record_.sources.resize(sources_mark);
    Abandon(e);
    DepthGuard depth(&depth_);
    NoCapture hide_nested(kCaptureKey);
    op.redispatchBoxed(keys & kBelowCaptureKey, stack);
    return;
  }

  try {
    DepthGuard depth(&depth_);
    if (prepared.observe_nested) {
      op.redispatchBoxed(keys & kBelowCaptureKey, stack);
    } else {
      NoCapture hide_nested(kCaptureKey);
      op.redispatchBoxed(keys & kBelowCaptureKey, stack);
    }
  } catch (const std::exception& e) {
    record_.args.resize(args_mark);
    record_.sources.resize(sources_mark);
    pending_writes_.clear();
    overwritten_.clear();
    if (failure_.ok()) {
      failure_ = absl::AbortedError(
          absl::StrCat("the forward pass threw while capturing (", op.operator_name().name, ": ",
                       FirstLine(e),
                       "); the trace would be incomplete. Fix the error and capture again"));
    }
    throw;
  }

  try {
    Record(node, prepared, stack);
  } catch (const std::exception& e) {
    Abandon(e);
  }
}

Recorder::PreparedOp Recorder::Prepare(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                                       NodeRecord* node) {
  NoCapture no_capture(kCaptureKey);
  PreparedOp prepared;
  const OpInfo* info = &Info(op);
  if (!assigned_buffers_.empty()) CheckAssignedBuffers();
  const c10::ArrayRef<c10::IValue> args = torch::jit::last(*stack, info->num_arguments);
  node->sources_begin = static_cast<int32_t>(record_.sources.size());
  for (const c10::IValue& arg : args) {
    ForEachTensor(arg, [&](const at::Tensor& tensor) {
      SourceRecord source = Resolve(tensor, &prepared.touches_buffer, &prepared.owner_module);
      record_.sources.push_back(source);
    });
  }
  node->sources_end = static_cast<int32_t>(record_.sources.size());
  if (options_.save_activations) {
    node->args_begin = static_cast<int32_t>(record_.args.size());
    for (const c10::IValue& arg : args) {
      // Lists are shared and mutable: TorchScript code may append to one after the call
      // (DenseNet appends to the list it passed to aten::cat). Keep the call's contents.
      record_.args.push_back(arg.isList() ? c10::IValue(arg.toList().copy()) : arg);
    }
    node->args_end = static_cast<int32_t>(record_.args.size());
  }
  pending_writes_.clear();
  overwritten_.clear();
  if (!info->written_arguments.empty()) {
    // Written arguments are named by their tensor index, the position of their source.
    int32_t tensor_index = 0;
    size_t next_written = 0;  // written_arguments is in argument order
    for (uint32_t a = 0; a < args.size(); ++a) {
      const bool written = next_written < info->written_arguments.size() &&
                           info->written_arguments[next_written] == a;
      if (written) ++next_written;
      ForEachTensor(args[a], [&](const at::Tensor& t) {
        if (written) PrepareWrite(t, WriteKind::kInplace, tensor_index);
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
  prepared.observe_nested = prepared.touches_buffer || fused;
  if (info->random && options_.save_activations) {
    // Replay draws the same numbers from this state (validation/replay.h).
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(generator.mutex());
    node->rng_slot = SaveSnapshot(generator.get_state());
  }
  // Copied out: nested calls may add to op_infos_ and move `*info`.
  prepared.op_index = info->index;
  prepared.num_returns = info->num_returns;
  prepared.symbol = info->symbol;
  if (info->returns_view && !options_.save_activations) {
    for (const c10::IValue& arg : args) {
      ForEachTensor(arg, [&](const at::Tensor& t) {
        if (t.defined() && t.has_storage()) prepared.view_bases.push_back(t);
      });
    }
  }
  return prepared;
}

// NOTE [Cold record memory]
// A capture reserves its record vectors at the sizes of the model's last capture, in
// memory the last trace freed. On a model larger than the L2 cache the forward passes
// since then have evicted it, so every new cache line of every vector is a miss when the
// recorder first writes it, a few per op. Once per op the recorder asks for the line
// 512 bytes past the end of each vector, for writing, so that the line is on its way
// several ops before it is needed (README "Performance").
namespace {
template <typename T>
void PrefetchAppend(const std::vector<T>& records) {
  constexpr uintptr_t kBytesAhead = 512;
  // An address, not a pointer into the vector: it may lie past the allocation, which a
  // prefetch (it never faults) may name.
  const uintptr_t end = reinterpret_cast<uintptr_t>(records.data() + records.size());
  __builtin_prefetch(reinterpret_cast<const void*>(end + kBytesAhead), /*rw=*/1);
}
}  // namespace

void Recorder::Record(NodeRecord node, const PreparedOp& prepared, torch::jit::Stack* stack) {
  NoCapture no_capture(kCaptureKey);
  PrefetchAppend(record_.nodes);
  PrefetchAppend(record_.sources);
  PrefetchAppend(record_.outputs);
  PrefetchAppend(record_.shapes);
  const ScriptSite site =
      layout_->torchscript ? script_sites_.Current(prepared.symbol) : ScriptSite{};
  node.module = site.in_script ? site.module : std::max<int32_t>(prepared.owner_module, 0);
  if (site.in_script && site.unknown_instance && prepared.owner_module >= 0 &&
      IsWithin(prepared.owner_module, site.module)) {
    // TorchScript could not name the submodule (a ModuleList iterated in a loop): the
    // module owning the parameters or buffers the op reads names it.
    node.module = prepared.owner_module;
  }
  node.op = prepared.op_index;
  node.layer = LayerOf(node.module, prepared.op_index, site);
  const int32_t index = static_cast<int32_t>(record_.nodes.size());
  node.outputs_begin = static_cast<int32_t>(record_.outputs.size());
  node.alias_writes_begin = static_cast<int32_t>(record_.alias_writes.size());
  record_.nodes.push_back(node);
  const c10::ArrayRef<c10::IValue> returns = torch::jit::last(*stack, prepared.num_returns);
  int32_t output_index = 0;
  for (const c10::IValue& value : returns) {
    ForEachTensor(value, [&](const at::Tensor& tensor) {
      RecordOpOutput(index, output_index++, tensor, prepared.touches_buffer);
    });
  }
  record_.nodes[index].outputs_end = static_cast<int32_t>(record_.outputs.size());
  if (!prepared.view_bases.empty()) {
    for (const c10::IValue& value : returns) {
      ForEachTensor(value, [&](const at::Tensor& view) { IndexAliases(view, prepared.view_bases); });
    }
  }
  if (!pending_writes_.empty()) CommitPendingWrites(index, returns);
  if (!overwritten_.empty()) RecordAliasWrites(index);
  record_.nodes[index].alias_writes_end = static_cast<int32_t>(record_.alias_writes.size());
}

void Recorder::IndexAliases(const at::Tensor& view, c10::ArrayRef<at::Tensor> bases) {
  if (!view.defined() || !view.has_storage()) return;
  const c10::StorageImpl* storage = view.storage().unsafeGetStorageImpl();
  std::vector<AliasedTensor>* aliased = nullptr;
  auto index = [&](const at::Tensor& tensor) {
    if (aliased == nullptr) aliased = &storages_[storage].aliased;
    for (const AliasedTensor& known : *aliased) {
      if (known.tensor == tensor.unsafeGetTensorImpl()) return;
    }
    const auto [begin, end] = ByteRange(tensor);
    aliased->push_back(AliasedTensor{tensor.unsafeGetTensorImpl(), begin, end});
  };
  for (const at::Tensor& base : bases) {
    if (base.storage().unsafeGetStorageImpl() == storage) index(base);
  }
  if (aliased != nullptr) index(view);  // a view of one of the bases
}

void Recorder::RecordAliasWrites(int32_t writer) {
  // See NOTE [Writes through views].
  for (OverwrittenValue& overwritten : overwritten_) {
    const SavedValue& saved = overwritten.saved;
    TensorEntry* entry = Lookup(saved.tensor);
    // Gone, saved anew (an output of this op), or model state with versions of its own.
    if (entry == nullptr || entry->slot != saved.slot || entry->node < 0 || entry->node == writer ||
        entry->buffer >= 0 || entry->buffer_view >= 0 || entry->param >= 0) {
      continue;
    }
    SourceRecord before;
    before.kind = SourceRecord::Kind::kNode;
    before.index = entry->node;
    before.output_index = entry->output_index;
    before.slot = entry->slot;
    const int32_t slot = overwritten.alias.defined() ? Save(overwritten.alias, saved.tensor) : -1;
    const int32_t output = AddAliasWrite(before, overwritten.written_tensor, overwritten.alias,
                                         std::move(overwritten.written), slot);
    entry = Lookup(saved.tensor);  // Save may have grown the table
    entry->node = writer;
    entry->output_index = output;
    entry->slot = slot;
  }
  for (const OverwrittenValue& overwritten : overwritten_) {
    if (overwritten.node_before >= 0 &&
        record_.nodes[overwritten.node_before].kind == NodeRecord::Kind::kInput) {
      const std::pair<int32_t, int32_t> written{overwritten.node_before, writer};
      if (std::find(record_.written_inputs.begin(), record_.written_inputs.end(), written) ==
          record_.written_inputs.end()) {
        record_.written_inputs.push_back(written);
      }
    }
  }
  overwritten_.clear();
}

int32_t Recorder::AddAliasWrite(SourceRecord before, int32_t written_tensor,
                                const at::Tensor& aliased, TensorGeometry written, int32_t slot) {
  const int32_t writer = static_cast<int32_t>(record_.nodes.size()) - 1;
  AliasWriteRecord& record = record_.alias_writes.emplace_back();
  record.before = before;
  record.written_tensor = written_tensor;
  if (aliased.defined()) record.aliased = GeometryOf(aliased);
  record.written = std::move(written);
  record.slot = slot;
  const int32_t k =
      static_cast<int32_t>(record_.alias_writes.size()) - 1 - record_.nodes[writer].alias_writes_begin;
  return -(k + 1);
}

void Recorder::Abandon(const std::exception& e) {
  pending_writes_.clear();
  overwritten_.clear();
  inert_ = true;
  if (!failure_.ok()) return;
  const bool memory = dynamic_cast<const std::bad_alloc*>(&e) != nullptr ||
                      std::string(e.what()).find("alloc") != std::string::npos;
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
  ++record_.stats.nested_ops;
  const OpInfo& info = Info(op);
  if (!info.written_arguments.empty()) {
    NoCapture no_capture(kCaptureKey);
    const c10::ArrayRef<c10::IValue> args = torch::jit::last(*stack, info.num_arguments);
    for (uint32_t a : info.written_arguments) {
      // A write the user-level op did not declare: see NOTE [Buffer writes].
      ForEachTensor(args[a],
                    [&](const at::Tensor& t) { PrepareWrite(t, WriteKind::kFused, -1); });
    }
  }
  DepthGuard depth(&depth_);
  op.redispatchBoxed(keys & kBelowCaptureKey, stack);
}

Recorder::TensorEntry* Recorder::Lookup(const c10::TensorImpl* impl) {
  auto it = tensors_.find(impl);
  if (it == tensors_.end()) return nullptr;
  // See NOTE [Address reuse in unsaved mode].
  const TensorEntry& entry = it->second;
  if ((entry.version.enabled() && CounterOf(entry.version) != CounterOf(impl->version_counter())) ||
      (entry.alive.has_value() && entry.alive->expired())) {
    tensors_.erase(it);  // a new tensor at a freed tensor's address
    return nullptr;
  }
  return &it->second;
}

void Recorder::Remember(const at::Tensor& tensor, TensorEntry entry) {
  if (!options_.save_activations && entry.param < 0 && entry.buffer < 0) {
    // See NOTE [Address reuse in unsaved mode].
    const c10::VariableVersion& version = tensor.unsafeGetTensorImpl()->version_counter();
    if (version.enabled()) {
      entry.version = version;
    } else {
      entry.alive.emplace(tensor.getIntrusivePtr());
    }
  }
  tensors_.insert_or_assign(tensor.unsafeGetTensorImpl(), std::move(entry));
}

Recorder::TensorEntry* Recorder::AddUnseen(const at::Tensor& tensor) {
  const c10::TensorImpl* impl = tensor.unsafeGetTensorImpl();
  if (const int32_t param = ParamId(impl); param >= 0) {
    if (!options_.save_activations) {
      // Nothing to remember about a parameter without its saved value: the layout finds
      // it again, and the tensor table stays the size of the op outputs.
      unsaved_param_ = TensorEntry();
      unsaved_param_.param = param;
      return &unsaved_param_;
    }
    TensorEntry entry;
    entry.param = param;
    entry.slot = Save(layout_->params[param].saved);
    tensors_.insert_or_assign(impl, std::move(entry));
    return Lookup(impl);
  }
  if (layout_->torchscript) {
    // Perhaps a buffer slot now holds it: see NOTE [Buffer reassignment].
    CheckAllBuffers();
    if (TensorEntry* entry = Lookup(impl)) return entry;
  }
  if (const int32_t buffer = BufferInPlaceOf(tensor); buffer >= 0) {
    // `b.data`: NOTE [Buffer writes].
    TensorEntry view;
    view.buffer_view = buffer;
    view.aliases_buffer = true;
    Remember(tensor, std::move(view));
    return Lookup(impl);
  }
  if (TensorEntry* alias = AddShallowCopy(tensor)) return alias;
  // A tensor from outside the capture: an input, or a constant once inputs are marked.
  TensorEntry outside;
  if (tensor.has_storage()) {
    auto it = storages_.find(tensor.storage().unsafeGetStorageImpl());
    outside.aliases_buffer = it != storages_.end() && !it->second.buffers.empty();
  }
  // A known tensor attribute is a constant even before the inputs are marked (under a
  // CaptureGuard they never are, and every other tensor from outside is an input).
  auto attribute = attributes_.find(impl);
  if (attribute != attributes_.end()) {
    outside.node = AddConstantNode(tensor, record_.constant_addresses[attribute->second]);
  } else if (!inputs_marked_) {
    outside.node = AddInputNode(tensor);
  } else {
    outside.node = AddConstantNode(tensor, std::string());
  }
  outside.slot = record_.outputs[record_.nodes[outside.node].outputs_begin].slot;
  Remember(tensor, std::move(outside));
  return Lookup(impl);
}

int32_t Recorder::BufferInPlaceOf(const at::Tensor& tensor) {
  if (!tensor.has_storage()) return -1;
  auto it = storages_.find(tensor.storage().unsafeGetStorageImpl());
  if (it == storages_.end()) return -1;
  for (int32_t buffer : it->second.buffers) {
    if (SamePlace(buffers_[buffer].holder, tensor)) return buffer;
  }
  return -1;
}

int32_t Recorder::AddConstantNode(const at::Tensor& tensor, std::string address) {
  NodeRecord node;
  node.kind = NodeRecord::Kind::kConstant;
  if (!address.empty()) {
    auto it = std::find(record_.constant_addresses.begin(), record_.constant_addresses.end(),
                        address);
    node.constant_address = static_cast<int32_t>(it - record_.constant_addresses.begin());
    if (it == record_.constant_addresses.end()) {
      record_.constant_addresses.push_back(std::move(address));
    }
  }
  node.outputs_begin = static_cast<int32_t>(record_.outputs.size());
  AddOutput(tensor, options_.save_activations ? Save(tensor) : -1);
  node.outputs_end = static_cast<int32_t>(record_.outputs.size());
  record_.nodes.push_back(node);
  return static_cast<int32_t>(record_.nodes.size()) - 1;
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
  TensorEntry* entry = Lookup(impl);
  if (entry == nullptr) entry = AddUnseen(tensor);
  if (entry->aliases_buffer) *touches_buffer = true;
  if (entry->buffer_view >= 0) {
    // Reads the buffer's current version, like the registered tensor (NOTE [Buffer writes]).
    const int32_t buffer = entry->buffer_view;
    if (*owner_module < 0) *owner_module = layout_->buffers[buffer].module;
    const int32_t version = EnsureBufferVersion(buffer);
    source.kind = SourceRecord::Kind::kNode;
    source.index = version;
    source.slot = record_.outputs[record_.nodes[version].outputs_begin].slot;
    return source;
  }
  if (entry->buffer >= 0) {
    const int32_t buffer = entry->buffer;
    if (*owner_module < 0) *owner_module = layout_->buffers[buffer].module;
    EnsureBufferVersion(buffer);
    entry = Lookup(impl);
  }
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

// NOTE [Shallow copies]
// The C++ frontend's factory functions (`torch::zeros`, `torch::ones`, ...) wrap what the
// dispatched op returned in a variable; when the op's output is still referenced (the
// trace saved it) that wrapping makes a shallow copy: a new TensorImpl on the same storage
// with the same geometry. Such a tensor is the op's output, not a tensor from outside.
Recorder::TensorEntry* Recorder::AddShallowCopy(const at::Tensor& tensor) {
  if (!tensor.has_storage()) return nullptr;
  auto it = storages_.find(tensor.storage().unsafeGetStorageImpl());
  if (it == storages_.end()) return nullptr;
  for (const SavedValue& value : it->second.saved) {
    const int32_t slot = value.slot;
    const at::Tensor& saved = record_.slots[slot];
    if (slot >= static_cast<int32_t>(slot_producers_.size()) || slot_producers_[slot].first < 0 ||
        saved.storage_offset() != tensor.storage_offset() || saved.sizes() != tensor.sizes() ||
        saved.strides() != tensor.strides() || saved.scalar_type() != tensor.scalar_type()) {
      continue;
    }
    TensorEntry entry;
    entry.node = slot_producers_[slot].first;
    entry.output_index = slot_producers_[slot].second;
    entry.slot = slot;
    entry.aliases_buffer = !it->second.buffers.empty();
    Remember(tensor, std::move(entry));
    return Lookup(tensor.unsafeGetTensorImpl());
  }
  return nullptr;
}

int32_t Recorder::AddInputNode(const at::Tensor& tensor) {
  NodeRecord node;
  node.kind = NodeRecord::Kind::kInput;
  node.outputs_begin = static_cast<int32_t>(record_.outputs.size());
  AddOutput(tensor, options_.save_activations ? Save(tensor) : -1);
  node.outputs_end = static_cast<int32_t>(record_.outputs.size());
  record_.nodes.push_back(node);
  return static_cast<int32_t>(record_.nodes.size()) - 1;
}

void Recorder::MarkInputs(const c10::IValue& inputs) {
  NoCapture no_capture(kCaptureKey);
  ForEachTensor(inputs, [&](const at::Tensor& tensor) {
    if (!tensor.defined() || Lookup(tensor.unsafeGetTensorImpl()) != nullptr) return;
    TensorEntry entry;
    entry.node = AddInputNode(tensor);
    entry.slot = record_.outputs[record_.nodes[entry.node].outputs_begin].slot;
    if (tensor.has_storage()) {
      auto it = storages_.find(tensor.storage().unsafeGetStorageImpl());
      entry.aliases_buffer = it != storages_.end() && !it->second.buffers.empty();
    }
    Remember(tensor, std::move(entry));
  });
  inputs_marked_ = true;
}

void Recorder::AddOutput(const at::Tensor& tensor, int32_t slot) {
  // Filled in place: a record assembled on the stack and copied in whole would wait, in
  // the copy, for every store before it to reach a cache line that may be cold (NOTE
  // [Cold record memory]).
  OutputRecord& output = record_.outputs.emplace_back();
  output.slot = slot;
  output.shape_begin = static_cast<int32_t>(record_.shapes.size());
  if (tensor.defined()) {
    const c10::IntArrayRef sizes = tensor.sizes();
    record_.shapes.insert(record_.shapes.end(), sizes.begin(), sizes.end());
    output.ndim = static_cast<int32_t>(sizes.size());
    output.dtype = tensor.scalar_type();
  }
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
  const int32_t slot = static_cast<int32_t>(record_.slots.size());
  // Saved values never hold the user's autograd graph alive.
  record_.slots.push_back(tensor.requires_grad() ? tensor.detach() : tensor);
  if (tensor.has_storage()) {
    storages_[tensor.storage().unsafeGetStorageImpl()].saved.push_back(
        SavedValue{slot, live != nullptr ? live : tensor.unsafeGetTensorImpl()});
  }
  return slot;
}

int32_t Recorder::SaveSnapshot(const at::Tensor& snapshot) {
  // A private copy nobody else can write: no copy-on-write registration.
  record_.slots.push_back(snapshot);
  return static_cast<int32_t>(record_.slots.size()) - 1;
}

void Recorder::RecordOpOutput(int32_t node, int32_t output_index, const at::Tensor& tensor,
                              bool touches_buffer) {
  const int32_t slot = options_.save_activations && tensor.defined() ? Save(tensor) : -1;
  if (slot >= 0) {
    if (slot >= static_cast<int32_t>(slot_producers_.size())) {
      slot_producers_.resize(record_.slots.size(), {-1, 0});
    }
    slot_producers_[slot] = {node, output_index};
  }
  AddOutput(tensor, slot);
  if (!tensor.defined()) return;
  TensorEntry* existing = Lookup(tensor.unsafeGetTensorImpl());
  if (existing != nullptr && (existing->buffer >= 0 || existing->buffer_view >= 0)) {
    // The op returned the registered buffer itself (an in-place write): its new version,
    // committed next, becomes the producer. See NOTE [Tensor identity].
    return;
  }
  TensorEntry entry;
  entry.node = node;
  entry.output_index = output_index;
  entry.slot = slot;
  if (existing != nullptr) {
    entry.aliases_buffer = existing->aliases_buffer;
    entry.version = existing->version;
    entry.alive = existing->alive;
    *existing = std::move(entry);
    return;
  }
  if (touches_buffer && tensor.has_storage()) {
    auto it = storages_.find(tensor.storage().unsafeGetStorageImpl());
    entry.aliases_buffer = it != storages_.end() && !it->second.buffers.empty();
  }
  Remember(tensor, std::move(entry));
}

void Recorder::PrepareWrite(const at::Tensor& tensor, WriteKind kind, int32_t written_tensor) {
  if (!tensor.defined() || !tensor.has_storage()) return;
  auto it = storages_.find(tensor.storage().unsafeGetStorageImpl());
  if (it == storages_.end()) return;
  StorageEntry& storage = it->second;
  const std::pair<int64_t, int64_t> range = ByteRange(tensor);
  if (!storage.saved.empty()) {
    // NOTE [Copy-on-write of saved values], NOTE [Writes through views]: saved values whose
    // bytes the write may touch are copied and noted; the others stay shared.
    std::optional<TensorGeometry> written;
    size_t kept = 0;
    for (const SavedValue& saved : storage.saved) {
      at::Tensor& value = record_.slots[saved.slot];
      if (!Overlap(ByteRange(value), range)) {
        storage.saved[kept++] = saved;
        continue;
      }
      if (!written.has_value()) written = GeometryOf(tensor);
      const TensorEntry* entry = Lookup(saved.tensor);
      overwritten_.push_back(OverwrittenValue{saved, value, written_tensor, *written,
                                              entry != nullptr ? entry->node : -1});
      value = CopyOfSaved(value);
      ++record_.stats.copy_on_write_clones;
    }
    storage.saved.resize(kept);
  }
  for (const AliasedTensor& aliased : storage.aliased) {
    // Without saved values: the same notes, with no value to copy.
    if (!Overlap({aliased.begin_byte, aliased.end_byte}, range)) continue;
    const TensorEntry* entry = Lookup(aliased.tensor);
    overwritten_.push_back(OverwrittenValue{SavedValue{-1, aliased.tensor}, at::Tensor(),
                                            written_tensor, TensorGeometry{},
                                            entry != nullptr ? entry->node : -1});
  }
  for (int32_t buffer : storage.buffers) {
    const BufferState& state = buffers_[buffer];
    if (Overlap({state.begin_byte, state.end_byte}, range)) {
      AddPendingWrite(buffer, kind, written_tensor, tensor);
    }
  }
}

void Recorder::AddPendingWrite(int32_t buffer, WriteKind kind, int32_t written_tensor,
                               const at::Tensor& written) {
  for (PendingWrite& pending : pending_writes_) {
    if (pending.buffer == buffer) {
      // One version per buffer per user-level op. The nested calls of a declared write
      // (add_ redispatching to its kernel) are that write; two declared arguments writing
      // the buffer are not one argument's write that replay could redo.
      if (written_tensor >= 0 && pending.written_tensor != written_tensor) {
        pending.written_tensor = -1;
      }
      return;
    }
  }
  EnsureBufferVersion(buffer);
  pending_writes_.push_back(PendingWrite{buffer, kind, written_tensor, written});
}

void Recorder::CommitPendingWrites(int32_t producer, c10::ArrayRef<c10::IValue> returns) {
  for (const PendingWrite& pending : pending_writes_) {
    BufferState& state = buffers_[pending.buffer];
    if (state.holder.has_storage() &&
        (state.holder.storage().unsafeGetStorageImpl() != state.storage ||
         ByteRange(state.holder) != std::make_pair(state.begin_byte, state.end_byte))) {
      ReindexBuffer(pending.buffer);  // set_
    }
    at::Tensor snapshot = Snapshot(state.holder);
    const int32_t slot = SaveSnapshotIfSaving(snapshot);
    std::optional<bool> changed;
    int32_t output = 0;
    if (pending.kind == WriteKind::kFused) {
      changed = !BitIdentical(state.latest, snapshot);
    } else {
      // The returned tensor that is the buffer, if the op wrote the buffer itself; otherwise
      // an alias write whose earlier state is the previous version (NOTE [Buffer writes]).
      output = -1;
      if (pending.written_tensor >= 0 &&
          (pending.written.unsafeGetTensorImpl() == state.holder.unsafeGetTensorImpl() ||
           SamePlace(pending.written, state.holder))) {
        int32_t k = 0;
        for (const c10::IValue& value : returns) {
          ForEachTensor(value, [&](const at::Tensor& t) {
            if (output < 0 && t.defined() &&
                (t.unsafeGetTensorImpl() == state.holder.unsafeGetTensorImpl() ||
                 t.unsafeGetTensorImpl() == pending.written.unsafeGetTensorImpl())) {
              output = k;
            }
            ++k;
          });
        }
      }
      if (output < 0) {
        SourceRecord before;
        before.kind = SourceRecord::Kind::kNode;
        before.index = state.last_version;
        before.slot = record_.outputs[record_.nodes[state.last_version].outputs_begin].slot;
        output = AddAliasWrite(before, pending.written_tensor, state.holder,
                               pending.written.defined() ? GeometryOf(pending.written)
                                                         : TensorGeometry{},
                               slot);
      }
    }
    AddBufferVersion(pending.buffer, pending.kind, producer, output, std::move(snapshot), changed,
                     slot);
  }
  pending_writes_.clear();
}

void Recorder::ReindexBuffer(int32_t buffer) {
  BufferState& state = buffers_[buffer];
  if (state.storage != nullptr) {
    auto it = storages_.find(state.storage);
    if (it != storages_.end()) {
      auto& owners = it->second.buffers;
      owners.erase(std::remove(owners.begin(), owners.end(), buffer), owners.end());
    }
  }
  state.storage = state.holder.storage().unsafeGetStorageImpl();
  storages_[state.storage].buffers.push_back(buffer);
  std::tie(state.begin_byte, state.end_byte) = ByteRange(state.holder);
}

int32_t Recorder::EnsureBufferVersion(int32_t buffer) {
  BufferState& state = buffers_[buffer];
  if (state.last_version >= 0) return state.last_version;
  // The initial read. NOTE [Independent initial values]: its value is a copy of the one
  // taken when capture started, which stays the buffer's `initial_value`, so that a check
  // of the read version against the initial value compares two tensors.
  at::Tensor read = Snapshot(state.latest);
  const int32_t slot = SaveSnapshotIfSaving(read);
  return AddBufferVersion(buffer, std::nullopt, -1, 0, std::move(read), std::nullopt, slot);
}

int32_t Recorder::AddBufferVersion(int32_t buffer, std::optional<WriteKind> kind, int32_t producer,
                                   int32_t producer_output, at::Tensor snapshot,
                                   std::optional<bool> changed, int32_t slot) {
  BufferState& state = buffers_[buffer];
  NodeRecord node;
  node.kind = NodeRecord::Kind::kBufferVersion;
  node.buffer = buffer;
  node.write_kind = kind;
  node.value_changed = changed;
  node.sources_begin = static_cast<int32_t>(record_.sources.size());
  if (producer >= 0) {
    SourceRecord source;
    source.kind = SourceRecord::Kind::kNode;
    source.index = producer;
    source.output_index = producer_output;
    record_.sources.push_back(source);
  }
  node.sources_end = static_cast<int32_t>(record_.sources.size());
  node.outputs_begin = static_cast<int32_t>(record_.outputs.size());
  AddOutput(snapshot, slot);
  node.outputs_end = static_cast<int32_t>(record_.outputs.size());
  const int32_t index = static_cast<int32_t>(record_.nodes.size());
  record_.nodes.push_back(node);
  state.latest = std::move(snapshot);
  state.last_version = index;
  if (TensorEntry* holder = Lookup(state.holder.unsafeGetTensorImpl())) {
    holder->node = index;
    holder->output_index = 0;
    holder->slot = slot;
  }
  return index;
}

void Recorder::SetHolder(int32_t buffer, const at::Tensor& tensor) {
  BufferState& state = buffers_[buffer];
  state.holder = tensor;
  TensorEntry* entry = Lookup(tensor.unsafeGetTensorImpl());
  if (entry == nullptr) entry = &tensors_[tensor.unsafeGetTensorImpl()];
  entry->buffer = buffer;
  entry->param = -1;
  entry->aliases_buffer = true;
  // The buffer slot keeps it alive: no address-reuse check (NOTE [Address reuse in unsaved
  // mode]).
  entry->version = c10::VariableVersion(c10::VariableVersion::DISABLED);
  entry->alive.reset();
  state.storage = nullptr;
  if (tensor.has_storage()) {
    state.storage = tensor.storage().unsafeGetStorageImpl();
    storages_[state.storage].buffers.push_back(buffer);
    std::tie(state.begin_byte, state.end_byte) = ByteRange(tensor);
  }
}

void Recorder::CheckAssignedBuffers() {
  record_.stats.buffer_slot_reads += static_cast<int64_t>(assigned_buffers_.size());
  for (int32_t buffer : assigned_buffers_) {
    const at::Tensor now = CurrentBuffer(*buffers_[buffer].entry);
    if (now.defined() &&
        now.unsafeGetTensorImpl() != buffers_[buffer].holder.unsafeGetTensorImpl()) {
      OnReassign(buffer, now);
    }
  }
}

void Recorder::CheckAllBuffers() {
  for (size_t buffer = 0; buffer < buffers_.size(); ++buffer) {
    const ModelLayout::BufferEntry& entry = *buffers_[buffer].entry;
    if (entry.owner == nullptr) continue;
    ++record_.stats.buffer_slot_reads;
    const c10::IValue& slot = entry.owner->getSlot(entry.slot);
    if (slot.isTensor() &&
        slot.unsafeToTensorImpl() != buffers_[buffer].holder.unsafeGetTensorImpl()) {
      OnReassign(static_cast<int32_t>(buffer), slot.toTensor());
    }
  }
}

void Recorder::OnReassign(int32_t buffer, const at::Tensor& tensor) {
  BufferState& state = buffers_[buffer];
  // The former holder stops being the buffer but keeps its producer.
  if (TensorEntry* former = Lookup(state.holder.unsafeGetTensorImpl())) former->buffer = -1;
  if (state.storage != nullptr) {
    auto it = storages_.find(state.storage);
    if (it != storages_.end()) {
      auto& owners = it->second.buffers;
      owners.erase(std::remove(owners.begin(), owners.end(), buffer), owners.end());
    }
  }
  state.former_holders.push_back(state.holder);
  // The new tensor's producer (none for a tensor from outside the capture) becomes the
  // version's producer. No Resolve here: it could check the buffers again, recursively.
  int32_t producer = -1;
  int32_t producer_output = 0;
  if (const TensorEntry* entry = Lookup(tensor.unsafeGetTensorImpl())) {
    producer = entry->node;
    producer_output = entry->output_index;
  }
  SetHolder(buffer, tensor);
  at::Tensor snapshot = Snapshot(tensor);
  const int32_t slot = SaveSnapshotIfSaving(snapshot);
  AddBufferVersion(buffer, WriteKind::kReassign, producer, producer_output, std::move(snapshot),
                   std::nullopt, slot);
}

bool Recorder::IsWithin(int32_t inner, int32_t outer) {
  if (outer == 0) return true;
  const std::vector<std::string>& base = *layout_->module_addresses;
  if (inner >= static_cast<int32_t>(base.size()) || outer >= static_cast<int32_t>(base.size())) {
    return false;
  }
  const std::string& a = base[inner];
  const std::string& b = base[outer];
  return a.size() > b.size() && a.compare(0, b.size(), b) == 0 && a[b.size()] == '.';
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
  const LayerKey key{module, op_index, site.in_script ? site.position : 0};
  auto [it, inserted] = layers_.try_emplace(key, next_layer_);
  if (inserted) ++next_layer_;
  return it->second;
}

void Recorder::OnAttributeAssigned() {
  if (inert_ || finished_ || assigned_buffers_.empty()) return;
  NoCapture no_capture(kCaptureKey);
  try {
    CheckAssignedBuffers();
  } catch (const std::exception& e) {
    Abandon(e);
  }
}

absl::StatusOr<CaptureRecord> Recorder::Finish(const c10::IValue& outputs) {
  NoCapture no_capture(kCaptureKey);
  if (finished_) return absl::FailedPreconditionError("the capture already finished");
  finished_ = true;
  if (!failure_.ok()) return failure_;
  CheckAllBuffers();
  // Saved values that live in a buffer's storage (views of buffers) would change with the
  // model's next write, which no capture sees: copy them now (NOTE [Copy-on-write of
  // saved values]).
  for (auto& [storage, entry] : storages_) {
    if (entry.buffers.empty()) continue;
    for (const SavedValue& saved : entry.saved) {
      record_.slots[saved.slot] = record_.slots[saved.slot].clone();
    }
    record_.stats.copy_on_write_clones += static_cast<int64_t>(entry.saved.size());
    entry.saved.clear();
  }
  ForEachTensor(outputs, [&](const at::Tensor& tensor) {
    if (!tensor.defined()) return;
    bool touches_buffer = false;
    int32_t owner_module = -1;
    SourceRecord source = Resolve(tensor, &touches_buffer, &owner_module);
    if (source.kind == SourceRecord::Kind::kParam) {
      // A returned parameter gets a source node (NOTE [Constants]).
      const int32_t constant =
          AddConstantNode(layout_->params[source.index].saved, layout_->params[source.index].address);
      source = SourceRecord();
      source.kind = SourceRecord::Kind::kNode;
      source.index = constant;
      source.slot = record_.outputs[record_.nodes[constant].outputs_begin].slot;
    }
    NodeRecord node;
    node.kind = NodeRecord::Kind::kOutput;
    node.sources_begin = static_cast<int32_t>(record_.sources.size());
    record_.sources.push_back(source);
    node.sources_end = static_cast<int32_t>(record_.sources.size());
    node.outputs_begin = static_cast<int32_t>(record_.outputs.size());
    AddOutput(tensor,
              source.slot >= 0 ? source.slot : (options_.save_activations ? Save(tensor) : -1));
    node.outputs_end = static_cast<int32_t>(record_.outputs.size());
    record_.nodes.push_back(node);
  });

  // NOTE [Unjournaled buffer changes]
  // A buffer whose value at the end differs from its last recorded version changed in a
  // way capture could not see (set_data, a raw write): Finish reports it (README
  // "Unjournaled buffer changes").
  for (size_t buffer = 0; buffer < buffers_.size(); ++buffer) {
    const BufferState& state = buffers_[buffer];
    const at::Tensor now = CurrentBuffer(*state.entry);
    if (!now.defined() || BitIdentical(now, state.latest)) continue;
    TraceDiagnostic diagnostic;
    const std::string& address = state.entry->address;
    diagnostic.address = address;
    diagnostic.message = absl::StrCat(
        "registered buffer \"", address,
        "\" changed without a journaled write: its value at the end of capture differs from "
        "its last recorded version. Write buffers with copy_ or other in-place ops (also "
        "through views and slices) or by reassignment (self.",
        address.substr(address.rfind('.') + 1),
        " = t in TorchScript), not with set_data or .data assignment; or set "
        "CaptureOptions::allow_unjournaled_writes to accept the change as a diagnostic");
    if (!options_.allow_unjournaled_writes) {
      return absl::FailedPreconditionError(diagnostic.message);
    }
    record_.diagnostics.push_back(std::move(diagnostic));
  }
  for (size_t buffer = 0; buffer < buffers_.size(); ++buffer) {
    record_.buffers[buffer].final_value = buffers_[buffer].latest;
  }
  record_.stats.marked_sites = script_sites_.marked();
  record_.stats.interpreter_sites = script_sites_.asked();
  record_.extra_module_addresses = module_addresses_.ReleaseExtra();
  record_.num_layers = next_layer_;
  ModelLayout::CaptureSizes& sizes = layout_->last_capture_sizes;
  constexpr auto kRelaxed = std::memory_order_relaxed;
  sizes.tensors.store(static_cast<uint32_t>(tensors_.size()), kRelaxed);
  sizes.storages.store(static_cast<uint32_t>(storages_.size()), kRelaxed);
  sizes.layers.store(static_cast<uint32_t>(layers_.size()), kRelaxed);
  sizes.layer_classes.store(static_cast<uint32_t>(layer_of_class_.size()), kRelaxed);
  sizes.nodes.store(static_cast<uint32_t>(record_.nodes.size()), kRelaxed);
  sizes.args.store(static_cast<uint32_t>(record_.args.size()), kRelaxed);
  sizes.sources.store(static_cast<uint32_t>(record_.sources.size()), kRelaxed);
  sizes.outputs.store(static_cast<uint32_t>(record_.outputs.size()), kRelaxed);
  sizes.shapes.store(static_cast<uint32_t>(record_.shapes.size()), kRelaxed);
  sizes.slots.store(static_cast<uint32_t>(record_.slots.size()), kRelaxed);
  return std::move(record_);
}

}  // namespace torchlens
