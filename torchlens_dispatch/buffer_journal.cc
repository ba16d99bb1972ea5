#include "torchlens_dispatch/buffer_journal.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/hash/hash.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "torchlens_dispatch/capture_options.h"
#include "torchlens_dispatch/ops/bit_identical.h"
#include "torchlens_dispatch/ops/ivalue_tensors.h"
#include "torchlens_dispatch/ops/saved_copy.h"
#include "torchlens_dispatch/ops/storage_ranges.h"

namespace torchlens {
namespace {

// A buffer's value as of now, sharing no memory with it and holding no autograd graph.
// Most buffers are small and dense: CopyOfSaved copies those with one memcpy, which costs
// a fraction of clone().
at::Tensor Snapshot(const at::Tensor& tensor) {
  return CopyOfSaved(tensor.requires_grad() ? DetachedAlias(tensor) : tensor);
}

// NOTE [Reassigned values by reference]
// A recurrent state reassigned at every step (`self.h = torch.tanh(...)`) gets a version
// per step, and copying each step's new tensor would be most of the journal's work on a
// recurrent model. Without a sink, no copy is needed:
//   - The version's value. Without saved values it has none. With saved values, the
//     tensor's producer saved it by reference in a slot that copy-on-write protects (NOTE
//     [Copy-on-write of saved values] in saved_value_index.h; the end of capture copies what still
//     lives in a buffer's storage): the version shares that slot. A tensor no op produced,
//     or whose producer was not saved (selective saving), is copied as before.
//   - The buffer's `latest`, which tells whether a later fused write changed the value,
//     whether the buffer changed without a journaled write by the end of capture, and is
//     the final value.
// The reassigned tensor itself is kept as `latest`, with a fingerprint of its bytes, and
// copied only when something needs its value as of then:
//   - before a fused write to the buffer (NoteWrite, which runs before the op does): its
//     version says whether the kernel changed the value;
//   - at the end of capture, as the final value, after the fingerprint of the tensor then
//     was compared with the one taken at the reassignment (a raw write through data_ptr
//     or set_data in between is an unjournaled change, NOTE [Unjournaled buffer changes],
//     and the final value is then the value at the end, the only one left);
//   - before an early stop restores the buffers.
// A reassignment, or an in-place write without saved values, replaces `latest` without
// copying the former one: nothing needs it. The written state is then kept the same way. The
// fingerprint is a 64-bit hash, so a changed value is missed with probability 2^-64.
// Contiguous dense CPU tensors qualify; others are copied at once, as before.
bool Fingerprintable(const at::Tensor& tensor) {
  return tensor.defined() && tensor.layout() == at::kStrided && tensor.device().is_cpu() &&
         tensor.has_storage() && tensor.is_contiguous() && !tensor.is_conj() && !tensor.is_neg() &&
         !tensor.is_quantized() && tensor.data_ptr() != nullptr;
}

size_t Fingerprint(const at::Tensor& tensor) {
  const absl::string_view bytes(static_cast<const char*>(tensor.data_ptr()), tensor.nbytes());
  return absl::HashOf(bytes, absl::MakeConstSpan(tensor.sizes().data(), tensor.sizes().size()),
                      static_cast<int>(tensor.scalar_type()));
}

}  // namespace

BufferJournal::BufferJournal(const ModelLayout& layout, RecordAppender* record, Tensors* tensors,
                             bool save)
    : record_(record), tensors_(tensors), save_(save), eager_(layout.eager) {
  buffers_.resize(layout.buffers.size());
  record_->record().buffers.reserve(layout.buffers.size());
  for (size_t i = 0; i < layout.buffers.size(); ++i) {
    const ModelLayout::BufferEntry& entry = layout.buffers[i];
    State& state = buffers_[i];
    state.entry = &entry;
    const at::Tensor tensor = CurrentBuffer(entry);
    if (tensor.defined()) state.latest = Snapshot(tensor);
    record_->record().buffers.push_back(BufferRecord{&entry.address, entry.module, state.latest});
    if (!tensor.defined()) continue;  // a slot holding None
    state.original = tensor;
    if (tensor.has_storage()) {
      state.original_storage = tensor.storage();
      state.original_offset = tensor.storage_offset();
      state.original_sizes.assign(tensor.sizes().begin(), tensor.sizes().end());
      state.original_strides.assign(tensor.strides().begin(), tensor.strides().end());
    }
    SetHolder(static_cast<int32_t>(i), tensor);
    if (entry.assigned_in_code) assigned_.push_back(static_cast<int32_t>(i));
  }
  // NOTE [Buffers on one storage]
  // A read or write of a tensor registered under several names is attributed to one of
  // them (they are one TensorImpl: the capture cannot tell which name the code used), and
  // a write through either of two overlapping buffers gives both a version. The trace
  // records which buffers are one tensor and which share bytes, so that an edit of one's
  // version reaches the reads recorded through the other (validation/intervene.cc).
  for (const auto& [storage, on_storage] : storages_) {
    if (on_storage.size() < 2) continue;
    for (int32_t a : on_storage) {
      for (int32_t b : on_storage) {
        const State& first = buffers_[a];
        const State& second = buffers_[b];
        if (a == b ||
            !Overlap({first.begin_byte, first.end_byte}, {second.begin_byte, second.end_byte})) {
          continue;
        }
        BufferRecord& record = record_->record().buffers[a];
        (SamePlace(first.holder, second.holder) ? record.same_tensor_as : record.overlapping)
            .push_back(b);
      }
    }
  }
}

int32_t BufferJournal::InPlaceOf(const at::Tensor& tensor) const {
  if (!tensor.has_storage()) return -1;
  const absl::InlinedVector<int32_t, 1>* buffers =
      BuffersIn(tensor.storage().unsafeGetStorageImpl());
  if (buffers == nullptr) return -1;
  for (int32_t buffer : *buffers) {
    if (SamePlace(buffers_[buffer].holder, tensor)) return buffer;
  }
  return -1;
}

int32_t BufferJournal::Read(int32_t buffer) {
  State& state = buffers_[buffer];
  if (state.version >= 0) return state.version;
  // NOTE [Independent initial values]
  // The initial read's value is a copy of the one taken when capture started, which stays
  // the buffer's `initial_value`, so that a check of the read version against the initial
  // value compares two tensors. A capture that keeps no values (and streams none) keeps
  // only the version's shape: it needs no copy, and `latest` stays the initial copy.
  return AddVersion(buffer, std::nullopt, nullptr,
                    KeepsValues() ? Snapshot(state.latest) : state.latest, std::nullopt);
}

int32_t BufferJournal::ReadInitial(int32_t buffer) {
  const at::Tensor& initial = record_->record().buffers[buffer].initial_value;
  // See NOTE [Independent initial values].
  const at::Tensor value = KeepsValues() ? Snapshot(initial) : initial;
  record_->record().late_initial_reads = true;
  return record_->AddBufferVersion(buffer, std::nullopt, nullptr, value, std::nullopt,
                                   save_ ? record_->AddSlot(value) : -1);
}

void BufferJournal::NoteWrite(const at::Tensor& written, WriteKind kind, int32_t written_tensor) {
  const absl::InlinedVector<int32_t, 1>* buffers =
      BuffersIn(written.storage().unsafeGetStorageImpl());
  if (buffers == nullptr) return;
  const std::pair<int64_t, int64_t> range = ByteRange(written);
  for (int32_t buffer : *buffers) {
    const State& state = buffers_[buffer];
    if (!Overlap({state.begin_byte, state.end_byte}, range)) continue;
    auto pending = std::find_if(pending_.begin(), pending_.end(),
                                [&](const PendingWrite& p) { return p.buffer == buffer; });
    if (pending != pending_.end()) {
      // One version per buffer per user-level op. The nested calls of a declared write
      // (add_ redispatching to its kernel) are that write; two declared arguments writing
      // the buffer are not one argument's write that replay could redo.
      if (written_tensor >= 0 && pending->written_tensor != written_tensor) {
        pending->written_tensor = -1;
      }
      continue;
    }
    Read(buffer);  // the version the write replaces
    // A fused write's version tells whether it changed the value: keep the value before.
    if (kind == WriteKind::kFused) CopyLatest(buffers_[buffer]);
    pending_.push_back(PendingWrite{buffer, kind, written_tensor, written});
  }
}

void BufferJournal::NoteGeometryChange(const at::Tensor& tensor, int32_t written_tensor) {
  const absl::InlinedVector<int32_t, 1>* buffers =
      BuffersIn(tensor.storage().unsafeGetStorageImpl());
  if (buffers == nullptr) return;
  for (int32_t buffer : *buffers) {
    if (buffers_[buffer].holder.unsafeGetTensorImpl() != tensor.unsafeGetTensorImpl() ||
        std::any_of(pending_.begin(), pending_.end(),
                    [&](const PendingWrite& p) { return p.buffer == buffer; })) {
      continue;
    }
    Read(buffer);  // the version the op replaces
    pending_.push_back(PendingWrite{buffer, WriteKind::kInplace, written_tensor, tensor});
  }
}

void BufferJournal::CommitWrites(int32_t producer, c10::ArrayRef<c10::IValue> returns) {
  for (const PendingWrite& pending : pending_) {
    State& state = buffers_[pending.buffer];
    if (state.holder.has_storage() &&
        (state.holder.storage().unsafeGetStorageImpl() != state.storage ||
         ByteRange(state.holder) != std::make_pair(state.begin_byte, state.end_byte))) {
      Reindex(pending.buffer);  // set_
    }
    // NOTE [Reassigned values by reference]: without saved values, the written state is
    // kept like a reassigned one.
    const bool by_reference = !save_ && !record_->streams() && Fingerprintable(state.holder);
    at::Tensor value = by_reference ? state.holder : Snapshot(state.holder);
    const int32_t slot = save_ ? record_->AddSlot(value) : -1;
    std::optional<bool> changed;
    SourceRecord source;
    source.kind = SourceRecord::Kind::kNode;
    source.index = producer;
    if (pending.kind == WriteKind::kFused) {
      changed = !BitIdentical(state.latest, value);
    } else {
      source.output_index = WrittenOutput(pending, producer, returns, slot, value);
    }
    const int32_t version =
        record_->AddBufferVersion(pending.buffer, pending.kind, &source, value, changed, slot);
    state.version = version;
    if (by_reference) {
      KeepHolderAsLatest(state);
    } else {
      state.latest = std::move(value);
      state.latest_is_holder = false;
    }
  }
  pending_.clear();
}

int32_t BufferJournal::WrittenOutput(const PendingWrite& pending, int32_t producer,
                                     c10::ArrayRef<c10::IValue> returns, int32_t slot,
                                     const at::Tensor& value) {
  const State& state = buffers_[pending.buffer];
  if (pending.written_tensor >= 0 &&
      (pending.written.unsafeGetTensorImpl() == state.holder.unsafeGetTensorImpl() ||
       SamePlace(pending.written, state.holder))) {
    int32_t output = -1;
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
    if (output >= 0) return output;
  }
  AliasWriteRecord write;
  write.before.kind = SourceRecord::Kind::kNode;
  write.before.index = state.version;
  write.before.slot = record_->OutputSlot(state.version);
  write.written_tensor = pending.written_tensor;
  write.aliased = GeometryOf(state.holder);
  if (pending.written.defined()) write.written = GeometryOf(pending.written);
  write.slot = slot;
  return record_->AddAliasWrite(producer, std::move(write), value);
}

void BufferJournal::SetHolder(int32_t buffer, const at::Tensor& tensor) {
  State& state = buffers_[buffer];
  state.holder = tensor;
  tensors_->SetBuffer(tensor, buffer);
  state.storage = nullptr;
  if (tensor.has_storage()) {
    state.storage = tensor.storage().unsafeGetStorageImpl();
    storages_[state.storage].push_back(buffer);
    std::tie(state.begin_byte, state.end_byte) = ByteRange(tensor);
  }
}

void BufferJournal::Unindex(int32_t buffer) {
  const State& state = buffers_[buffer];
  if (state.storage == nullptr) return;
  auto it = storages_.find(state.storage);
  if (it == storages_.end()) return;
  it->second.erase(std::remove(it->second.begin(), it->second.end(), buffer), it->second.end());
  // A recurrent state reassigned at every step leaves a storage per step: the index keeps
  // only the live ones, so that it stays the size of the buffers, in cache.
  if (it->second.empty()) storages_.erase(it);
}

void BufferJournal::Reindex(int32_t buffer) {
  State& state = buffers_[buffer];
  Unindex(buffer);
  state.storage = state.holder.storage().unsafeGetStorageImpl();
  storages_[state.storage].push_back(buffer);
  std::tie(state.begin_byte, state.end_byte) = ByteRange(state.holder);
}

void BufferJournal::CheckAssigned() {
  record_->record().stats.buffer_slot_reads += static_cast<int64_t>(assigned_.size());
  for (int32_t buffer : assigned_) {
    const c10::TensorImpl* now = CurrentBufferImpl(*buffers_[buffer].entry);
    if (now != nullptr && now != buffers_[buffer].holder.unsafeGetTensorImpl()) {
      OnReassign(buffer, CurrentBuffer(*buffers_[buffer].entry));
    }
  }
}

void BufferJournal::CheckAll() {
  for (size_t buffer = 0; buffer < buffers_.size(); ++buffer) {
    const ModelLayout::BufferEntry& entry = *buffers_[buffer].entry;
    if (entry.owner == nullptr) continue;
    ++record_->record().stats.buffer_slot_reads;
    const c10::IValue& slot = entry.owner->getSlot(entry.slot);
    if (slot.isTensor() &&
        slot.unsafeToTensorImpl() != buffers_[buffer].holder.unsafeGetTensorImpl()) {
      OnReassign(static_cast<int32_t>(buffer), slot.toTensor());
    }
  }
}

void BufferJournal::Assign(int32_t buffer, const at::Tensor& tensor) {
  if (tensor.defined() &&
      tensor.unsafeGetTensorImpl() != buffers_[buffer].holder.unsafeGetTensorImpl()) {
    OnReassign(buffer, tensor);
  }
}

int32_t BufferJournal::OtherHolder(int32_t buffer, const at::Tensor& tensor) const {
  if (!tensor.defined() || !tensor.has_storage()) return -1;
  const absl::InlinedVector<int32_t, 1>* buffers =
      BuffersIn(tensor.storage().unsafeGetStorageImpl());
  if (buffers == nullptr) return -1;
  for (int32_t other : *buffers) {
    if (other != buffer &&
        buffers_[other].holder.unsafeGetTensorImpl() == tensor.unsafeGetTensorImpl()) {
      return other;
    }
  }
  return -1;
}

void BufferJournal::OnReassign(int32_t buffer, const at::Tensor& tensor) {
  State& state = buffers_[buffer];
  // NOTE [Former registered tensors]
  // The tensor the slot held stays a value the code may use after the reassignment:
  // `old = self.b; self.b = t; y = old + 1; old.add_(x)`, or a swap through a local. It
  // keeps its producer when an op made it. Otherwise its value is the buffer's current
  // version, or, when nothing read the buffer before, its initial value: that read version
  // is made when the tensor is first used (the reassignment then comes before it in the
  // buffer's versions), so a buffer reassigned without being read gets no extra version.
  // With saved values the version's value is a copy, so a later write to the old tensor
  // changes neither the version nor the replay of the ops that read it. A tensor another
  // buffer's slot also holds (`self.a = self.b`, then `self.b = t`) stays that buffer's.
  // The new tensor's producer is likewise the current version of the buffer whose slot
  // holds it, when no op made it.
  if (OtherHolder(buffer, state.holder) < 0) {
    tensors_->SetFormerBuffer(state.holder, buffer, state.version);
  }
  Unindex(buffer);
  // NOTE [Former holders kept alive]
  // A capture that keeps values identifies tensors by address alone, so a former holder
  // is kept alive: its address must not come back as a new tensor's. Without kept values
  // the recorder pinned its entry's version counter instead (SetFormerBuffer), which
  // tells a new tensor at that address apart, and it dies when the model drops it, as in
  // the plain forward (a recurrent state reassigned at every step would otherwise keep
  // every step's tensor to the end of the capture).
  if (KeepsValues()) state.former_holders.push_back(state.holder);
  // The new tensor's producer (none for a tensor from outside the capture) is the
  // version's producer.
  SourceRecord producer = tensors_->SourceOf(tensor);
  if (producer.kind != SourceRecord::Kind::kNode) {
    if (const int32_t from = OtherHolder(buffer, tensor); from >= 0) {
      producer.kind = SourceRecord::Kind::kNode;
      producer.index = Read(from);
      producer.output_index = 0;
      producer.slot = record_->OutputSlot(producer.index);
    }
  }
  SetHolder(buffer, tensor);
  const SourceRecord* source = producer.kind == SourceRecord::Kind::kNode ? &producer : nullptr;
  // NOTE [Reassigned values by reference]: with saved values, the producer's saved value
  // is this tensor, kept by reference and copied on write.
  const int32_t shared_slot = save_ && source != nullptr ? producer.slot : -1;
  if ((!save_ || shared_slot >= 0) && !record_->streams() && Fingerprintable(tensor)) {
    state.version = record_->AddBufferVersion(buffer, WriteKind::kReassign, source, tensor,
                                              std::nullopt, shared_slot);
    KeepHolderAsLatest(state);
    return;
  }
  AddVersion(buffer, WriteKind::kReassign, source, Snapshot(tensor), std::nullopt);
}

void BufferJournal::KeepHolderAsLatest(State& state) {
  state.latest = state.holder;
  state.latest_is_holder = true;
  state.holder_fingerprint = Fingerprint(state.holder);
}

void BufferJournal::CopyLatest(State& state) {
  if (!state.latest_is_holder) return;
  state.latest = Snapshot(state.latest);
  state.latest_is_holder = false;
}

int32_t BufferJournal::AddVersion(int32_t buffer, std::optional<WriteKind> kind,
                                  const SourceRecord* producer, at::Tensor value,
                                  std::optional<bool> changed) {
  State& state = buffers_[buffer];
  const int32_t slot = save_ ? record_->AddSlot(value) : -1;
  state.version = record_->AddBufferVersion(buffer, kind, producer, value, changed, slot);
  state.latest = std::move(value);
  state.latest_is_holder = false;
  return state.version;
}

void BufferJournal::RestoreInitialState() {
  restored_ = true;
  const CaptureRecord& record = record_->record();
  for (State& state : buffers_) CopyLatest(state);  // the values the forward left
  for (size_t buffer = 0; buffer < buffers_.size(); ++buffer) {
    State& state = buffers_[buffer];
    if (!state.original.defined()) continue;
    if (state.entry->owner != nullptr &&
        CurrentBuffer(*state.entry).unsafeGetTensorImpl() != state.original.unsafeGetTensorImpl()) {
      state.entry->owner->setSlot(state.entry->slot, state.original);  // undo `self.h = t`
    }
    at::Tensor& tensor = state.original;
    if (state.original_storage &&
        (!tensor.has_storage() || !tensor.storage().is_alias_of(state.original_storage) ||
         tensor.storage_offset() != state.original_offset ||
         tensor.sizes() != c10::IntArrayRef(state.original_sizes))) {
      tensor.set_(state.original_storage, state.original_offset, state.original_sizes,
                  state.original_strides);  // undo set_
    }
    const at::Tensor& initial = record.buffers[buffer].initial_value;
    if (initial.defined()) tensor.detach().copy_(initial);
  }
}

absl::InlinedVector<const c10::StorageImpl*, 4> BufferJournal::InitialStorages() const {
  absl::InlinedVector<const c10::StorageImpl*, 4> storages;
  for (const State& state : buffers_) {
    if (state.original_storage) storages.push_back(state.original_storage.unsafeGetStorageImpl());
    if (state.original.defined() && state.original.has_storage()) {
      storages.push_back(state.original.storage().unsafeGetStorageImpl());
    }
  }
  return storages;
}

absl::Status BufferJournal::Finish(bool allow_unjournaled) {
  CaptureRecord& record = record_->record();
  if (restored_) {
    for (size_t buffer = 0; buffer < buffers_.size(); ++buffer) {
      record.buffers[buffer].final_value = buffers_[buffer].latest;
    }
    return absl::OkStatus();
  }
  // NOTE [Unjournaled buffer changes]
  // A buffer whose value at the end differs from its last recorded version changed in a
  // way capture could not see (set_data, a raw write): Finish reports it (README
  // "Unjournaled buffer changes").
  for (State& state : buffers_) {
    const at::Tensor now = SlotValue(state);
    if (state.latest_is_holder) {
      // NOTE [Reassigned values by reference]: `latest` is the tensor reassigned, whose
      // bytes may have changed since without a journaled write.
      const bool unchanged =
          !now.defined() || (now.unsafeGetTensorImpl() == state.latest.unsafeGetTensorImpl() &&
                             Fingerprintable(now) && Fingerprint(now) == state.holder_fingerprint);
      CopyLatest(state);
      if (unchanged) continue;
    } else if (!now.defined() || BitIdentical(now, state.latest)) {
      continue;
    }
    TraceDiagnostic diagnostic;
    const std::string& address = state.entry->address;
    diagnostic.address = address;
    diagnostic.message = absl::StrCat(
        "registered buffer \"", address,
        "\" changed without a journaled write: its value at the end of capture differs from "
        "its last recorded version. Write buffers with copy_ or other in-place ops (also "
        "through views and slices) or by reassignment (self.",
        address.substr(address.rfind('.') + 1),
        eager_ ? " = t), not with .data = t or set_data; or pass allow_unjournaled_writes=True "
                 "to accept the change as a diagnostic"
               : " = t in TorchScript), not with set_data or .data assignment; or set "
                 "CaptureOptions::allow_unjournaled_writes to accept the change as a diagnostic");
    if (!allow_unjournaled) {
      absl::Status status = absl::FailedPreconditionError(diagnostic.message);
      status.SetPayload(kUnjournaledWritePayload, absl::Cord(address));
      return status;
    }
    record.diagnostics.push_back(std::move(diagnostic));
  }
  for (size_t buffer = 0; buffer < buffers_.size(); ++buffer) {
    record.buffers[buffer].final_value = buffers_[buffer].latest;
  }
  return absl::OkStatus();
}

}  // namespace torchlens
