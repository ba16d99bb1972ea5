// Recorder: tensors seen for the first time (inputs, constants, parameters, shallow
// copies, views of buffers) and the tensor table's side of the buffer journal.
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "torchlens_dispatch/ops/capture_key.h"
#include "torchlens_dispatch/ops/ivalue_tensors.h"
#include "torchlens_dispatch/recorder.h"

namespace torchlens {

Recorder::TensorEntry* Recorder::AddUnseen(const at::Tensor& tensor) {
  const c10::TensorImpl* impl = tensor.unsafeGetTensorImpl();
  if (const int32_t param = params_.IdOf(impl); param >= 0) {
    // A parameter that is also a registered buffer (`register_buffer("b",
    // weight.detach())`): one memory, read and written as the buffer, so that its writes
    // are versions the parameter's reads follow (NOTE [Buffer writes]).
    if (C10_UNLIKELY(layout_->params_share_buffer_storage)) {
      if (const int32_t buffer = journal_.InPlaceOf(tensor); buffer >= 0) {
        return RememberInPlaceOf(tensor, buffer);
      }
    }
    if (!policy_.streaming()) {
      if (policy_.saves()) {
        // NOTE [Parameters read by reference].
        if (C10_UNLIKELY(params_.storage_written())) {
          const auto written = index_.storages().find(tensor.storage().unsafeGetStorageImpl());
          if (written != index_.storages().end() && written->second.written_param) {
            return KeepParameter(param);
          }
        }
        if (!params_.FirstRead(param)) {
          // Read again (a recurrent weight): in the table from now on, so that its next
          // reads end at their first lookup.
          TensorEntry entry;
          entry.param = param;
          tensors_.insert_or_assign(impl, std::move(entry));
          return Lookup(impl);
        }
      }
      // Nothing to remember about a parameter read by reference: the layout finds it
      // again, and the tensor table stays the size of the op outputs.
      unsaved_param_ = TensorEntry();
      unsaved_param_.param = param;
      return &unsaved_param_;
    }
    // Streaming: read as the parameter itself (no slot); its first write is watched: NOTE
    // [Parameters written through views].
    index_.storages()[tensor.storage().unsafeGetStorageImpl()].streamed_param = param;
    TensorEntry entry;
    entry.param = param;
    tensors_.insert_or_assign(impl, std::move(entry));
    return Lookup(impl);
  }
  if (layout_->torchscript) {
    // Perhaps a buffer slot now holds it: see NOTE [Buffer reassignment].
    journal_.CheckAll();
    if (TensorEntry* entry = Lookup(impl)) return entry;
  }
  if (const int32_t buffer = journal_.InPlaceOf(tensor); buffer >= 0) {
    return RememberInPlaceOf(tensor, buffer);  // `b.data`: NOTE [Buffer writes]
  }
  if (TensorEntry* alias = AddShallowCopy(tensor)) return alias;
  // A tensor from outside the capture: an input, or a constant once inputs are marked.
  TensorEntry outside;
  outside.aliases_buffer = AliasesBuffer(tensor);
  // A known tensor attribute is a constant even before the inputs are marked (under a
  // CaptureGuard they never are, and every other tensor from outside is an input).
  auto attribute = attributes_.find(impl);
  if (attribute != attributes_.end()) {
    outside.node = AddConstantNode(tensor, record_.record().constant_addresses[attribute->second]);
  } else if (!progress_.inputs_marked) {
    outside.node = AddInputNode(tensor);
  } else {
    outside.node = AddConstantNode(tensor, std::string());
  }
  outside.slot = record_.OutputSlot(outside.node);
  Remember(tensor, std::move(outside));
  return Lookup(impl);
}

Recorder::TensorEntry* Recorder::KeepParameter(int32_t param) {
  // See NOTE [Parameters read by reference].
  params_.NoteKept(param);
  const ModelLayout::ParamEntry& layout = layout_->params[param];
  const c10::TensorImpl* impl = layout.tensor.unsafeGetTensorImpl();
  // Noted as the parameter's (not its detached alias's) for its writes through views.
  const int32_t slot = Save(layout.saved, impl);
  std::vector<int32_t>& param_slots = record_.record().param_slots;
  if (param_slots.empty()) param_slots.assign(layout_->params.size(), -1);
  param_slots[param] = slot;
  // An op that returned the parameter itself (`contiguous`) made it its output: the
  // parameter's later reads read that output, as they would had it been kept from the
  // start.
  if (TensorEntry* known = Lookup(impl)) {
    if (known->param == param) known->slot = slot;  // entered when read again
    return known;
  }
  TensorEntry entry;
  entry.param = param;
  entry.slot = slot;
  tensors_.insert_or_assign(impl, std::move(entry));
  return Lookup(impl);
}

void Recorder::KeepWrittenParameters(const at::Tensor& tensor) {
  if (layout_->params_detached && tensor.storage().use_count() == 1) return;
  const auto it = layout_->param_storages.find(tensor.storage().unsafeGetStorageImpl());
  if (it == layout_->param_storages.end()) return;
  params_.NoteStorageWritten();
  for (const int32_t param : it->second) {
    if (params_.ReadOnly(param)) KeepParameter(param);
  }
}

Recorder::TensorEntry* Recorder::RememberInPlaceOf(const at::Tensor& tensor, int32_t buffer) {
  TensorEntry view;
  view.buffer_view = buffer;
  view.aliases_buffer = true;
  Remember(tensor, std::move(view));
  return Lookup(tensor.unsafeGetTensorImpl());
}

int32_t Recorder::ConstantAddress(std::string address) {
  if (address.empty()) return -1;
  std::vector<std::string>& addresses = record_.record().constant_addresses;
  auto it = std::find(addresses.begin(), addresses.end(), address);
  const int32_t index = static_cast<int32_t>(it - addresses.begin());
  if (it == addresses.end()) addresses.push_back(std::move(address));
  return index;
}

int32_t Recorder::AddConstantNode(const at::Tensor& tensor, std::string address) {
  const int32_t address_index = ConstantAddress(std::move(address));
  return record_.AddSourceNode(NodeRecord::Kind::kConstant, tensor,
                               policy_.saves() ? Save(tensor) : -1, address_index);
}

int32_t Recorder::AddWrittenParameterNode(int32_t param, int32_t slot) {
  // See NOTE [Parameters written through views]. The value before the write: the copy in
  // the slot, or (streamed, or not saved) the parameter itself, not yet written.
  const ModelLayout::ParamEntry& entry = layout_->params[param];
  const bool copied = slot >= 0 && !policy_.streaming();
  return record_.AddSourceNode(NodeRecord::Kind::kConstant,
                               copied ? record_.slot(slot) : entry.saved, slot,
                               ConstantAddress(entry.address));
}

// NOTE [Shallow copies]
// The C++ frontend's factory functions (`torch::zeros`, `torch::ones`, ...) wrap what the
// dispatched op returned in a variable; when the op's output is still referenced (the
// trace saved it) that wrapping makes a shallow copy: a new TensorImpl on the same storage
// with the same geometry. Such a tensor is the op's output, not a tensor from outside.
Recorder::TensorEntry* Recorder::AddShallowCopy(const at::Tensor& tensor) {
  if (!tensor.has_storage()) return nullptr;
  index_.IndexSavedValues();
  auto it = index_.storages().find(tensor.storage().unsafeGetStorageImpl());
  if (it == index_.storages().end()) return nullptr;
  for (const SavedValue& value : it->second.saved) {
    const int32_t slot = value.slot;
    const at::Tensor& saved = record_.slot(slot);
    if (slot >= static_cast<int32_t>(index_.slot_producers().size()) ||
        index_.slot_producers()[slot].first < 0 ||
        saved.storage_offset() != tensor.storage_offset() || saved.sizes() != tensor.sizes() ||
        saved.strides() != tensor.strides() || saved.scalar_type() != tensor.scalar_type()) {
      continue;
    }
    TensorEntry entry;
    entry.node = index_.slot_producers()[slot].first;
    entry.output_index = index_.slot_producers()[slot].second;
    entry.slot = slot;
    entry.aliases_buffer = AliasesBuffer(tensor);
    Remember(tensor, std::move(entry));
    return Lookup(tensor.unsafeGetTensorImpl());
  }
  return nullptr;
}

int32_t Recorder::AddInputNode(const at::Tensor& tensor) {
  return record_.AddSourceNode(NodeRecord::Kind::kInput, tensor,
                               policy_.saves() ? Save(tensor) : -1);
}

void Recorder::MarkInputs(const c10::IValue& inputs) {
  NoCapture no_capture(kCaptureKey);
  ForEachTensor(inputs, [&](const at::Tensor& tensor) {
    if (!tensor.defined() || Lookup(tensor.unsafeGetTensorImpl()) != nullptr) return;
    TensorEntry entry;
    entry.node = AddInputNode(tensor);
    entry.slot = record_.OutputSlot(entry.node);
    entry.aliases_buffer = AliasesBuffer(tensor);
    Remember(tensor, std::move(entry));
  });
  progress_.inputs_marked = true;
}

SourceRecord Recorder::SourceOf(const at::Tensor& tensor) {
  SourceRecord source;
  TensorEntry* entry = Lookup(tensor.unsafeGetTensorImpl());
  if (entry != nullptr) ReadFormerBuffer(entry);
  if (entry == nullptr || entry->node < 0) return source;
  source.kind = SourceRecord::Kind::kNode;
  source.index = entry->node;
  source.output_index = entry->output_index;
  source.slot = entry->slot;
  return source;
}

void Recorder::ReadFormerBuffer(TensorEntry* entry) {
  if (entry->node >= 0 || entry->former_buffer < 0) return;
  // See NOTE [Former registered tensors].
  const int32_t version = journal_.ReadInitial(entry->former_buffer);
  entry->former_buffer = -1;
  ProducedBy(entry, version);
}

void Recorder::ProducedBy(TensorEntry* entry, int32_t version) {
  entry->node = version;
  entry->output_index = 0;
  entry->slot = record_.OutputSlot(version);
}

void Recorder::SetFormerBuffer(const at::Tensor& tensor, int32_t buffer, int32_t version) {
  TensorEntry* entry = Lookup(tensor.unsafeGetTensorImpl());
  if (entry == nullptr) return;
  entry->buffer = -1;
  Pin(tensor, entry);            // NOTE [Former holders kept alive] in buffer_journal.cc
  if (entry->node >= 0) return;  // it keeps its producer
  // See NOTE [Former registered tensors].
  if (version < 0) {
    entry->former_buffer = buffer;
    return;
  }
  ProducedBy(entry, version);
}

void Recorder::SetBuffer(const at::Tensor& tensor, int32_t buffer) {
  TensorEntry* entry = Lookup(tensor.unsafeGetTensorImpl());
  if (entry == nullptr) entry = &tensors_[tensor.unsafeGetTensorImpl()];
  entry->buffer = buffer;
  entry->former_buffer = -1;
  entry->param = -1;
  entry->aliases_buffer = true;
  // The buffer slot keeps it alive: no address-reuse check (NOTE [Address reuse in unsaved
  // mode]).
  entry->version = c10::VariableVersion(c10::VariableVersion::DISABLED);
  entry->alive.reset();
}

}  // namespace torchlens
