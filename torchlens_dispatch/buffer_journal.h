// The journal of a capture's registered buffers: which version of each buffer is
// current, and the versions that writes and reassignments add (NOTE [Buffer writes] and
// NOTE [Buffer reassignment] in recorder.h say what counts as one).
//
// The recorder asks it what a read of a buffer reads (`Read`), tells it before an op
// writes a tensor (`NoteWrite`: the buffers whose bytes the tensor overlaps get a pending
// version) and after the op ran (`CommitWrites`: each pending version becomes a node,
// with its value snapshot), and lets it check the TorchScript attribute slots for
// reassignments. It appends its nodes through the capture's RecordAppender and learns
// about tensors through the `Tensors` interface the recorder implements.
//
//   BufferJournal journal(*layout, &appender, &tensors, /*save=*/true);
//   journal.NoteWrite(view_of_b, WriteKind::kInplace, /*written_tensor=*/0);
//   ... the op runs ...
//   journal.CommitWrites(op_node, returns);
//   absl::Status unjournaled = journal.Finish(/*allow_unjournaled=*/false);
#ifndef TORCHLENS_DISPATCH_BUFFER_JOURNAL_H_
#define TORCHLENS_DISPATCH_BUFFER_JOURNAL_H_

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "graph/capture_record.h"
#include "torchlens_dispatch/model_layout.h"
#include "torchlens_dispatch/record_appender.h"

namespace torchlens {

class BufferJournal {
 public:
  // What the journal needs from the recorder's table of tensors.
  class Tensors {
   public:
    virtual ~Tensors() = default;
    // Where `tensor`'s value came from (kNode naming its producer), or a kNone source.
    virtual SourceRecord SourceOf(const at::Tensor& tensor) = 0;
    // `tensor` is now the registered tensor of `buffer`.
    virtual void SetBuffer(const at::Tensor& tensor, int32_t buffer) = 0;
    // `tensor` was the registered tensor of `buffer` and no longer is (NOTE [Former
    // registered tensors]). Unless an op produced it, its value is that of version node
    // `version`, or with -1 the buffer's initial value (ReadInitial, on first use).
    virtual void SetFormerBuffer(const at::Tensor& tensor, int32_t buffer, int32_t version) = 0;
  };

  // Snapshots every buffer's value (the initial values) and appends nothing yet. With
  // `save`, versions keep their values in the record's slots.
  BufferJournal(const ModelLayout& layout, RecordAppender* record, Tensors* tensors, bool save);
  BufferJournal(const BufferJournal&) = delete;
  BufferJournal& operator=(const BufferJournal&) = delete;

  // The buffers living in `storage`, or null.
  const absl::InlinedVector<int32_t, 1>* BuffersIn(const c10::StorageImpl* storage) const {
    auto it = storages_.find(storage);
    return it == storages_.end() || it->second.empty() ? nullptr : &it->second;
  }
  // A buffer whose registered tensor has exactly `tensor`'s place in its storage (`b.data`
  // made without dispatching), or -1.
  int32_t InPlaceOf(const at::Tensor& tensor) const;

  // The node of the buffer's current version: its initial read if nothing read or wrote
  // it before. NOTE [Independent initial values]: the read holds its own copy.
  int32_t Read(int32_t buffer);
  // A read version of the buffer's initial value, whatever its current version is: for
  // its former registered tensor, used after a reassignment (NOTE [Former registered
  // tensors]).
  int32_t ReadInitial(int32_t buffer);

  // Before `written` is written by the current user-level op: each buffer whose bytes it
  // overlaps gets one pending version. `written_tensor` is its tensor argument index, -1
  // for a write inside a kernel (kFused).
  void NoteWrite(const at::Tensor& written, WriteKind kind, int32_t written_tensor);
  // Before an in-place view op gives `tensor` another geometry (NOTE [In-place view ops] in
  // recorder.h): a pending kInplace version of the buffers whose registered tensor it is.
  void NoteGeometryChange(const at::Tensor& tensor, int32_t written_tensor);
  bool has_pending_writes() const { return !pending_.empty(); }
  // After op `producer` ran and returned `returns`: the pending writes become versions.
  void CommitWrites(int32_t producer, c10::ArrayRef<c10::IValue> returns);
  void DropPendingWrites() { pending_.clear(); }

  // Reassignments: the buffers whose slots some method's code assigns, or every slot.
  bool has_assigned_buffers() const { return !assigned_.empty(); }
  void CheckAssigned();
  void CheckAll();
  // Eager models, whose slots the journal cannot read: the slot of `buffer` now holds
  // `tensor` (a reassignment when it is another tensor than the holder).
  void Assign(int32_t buffer, const at::Tensor& tensor);

  // End of capture. NOTE [Unjournaled buffer changes]: kFailedPrecondition naming a buffer
  // whose value differs from its last version, unless `allow_unjournaled`, which records
  // the change as a diagnostic instead. Then each buffer's final value goes into the
  // record.
  absl::Status Finish(bool allow_unjournaled);
  // The buffers as they were when the journal started: each slot holds its tensor of then
  // again, in its storage of then, with its value of then (an early stop leaves no
  // half-updated state). Journals nothing; Finish then checks no unjournaled change.
  void RestoreInitialState();
  // The storages RestoreInitialState writes: each buffer's storage when the journal
  // started, which a tensor the slot no longer holds may still live in.
  absl::InlinedVector<const c10::StorageImpl*, 4> InitialStorages() const;

 private:
  struct State {
    const ModelLayout::BufferEntry* entry;  // in the layout
    at::Tensor original;                    // the registered tensor when the journal started
    c10::Storage original_storage;          // and its place then
    int64_t original_offset = 0;
    at::DimVector original_sizes, original_strides;  // inline: no heap block per buffer
    at::Tensor holder;                               // the registered tensor as last seen
    // Earlier holders, when kept alive (NOTE [Former holders kept alive] in the .cc).
    std::vector<at::Tensor> former_holders;
    const c10::StorageImpl* storage = nullptr;  // where `holder` is indexed
    int64_t begin_byte = 0, end_byte = 0;       // range of `holder` in its storage
    int32_t version = -1;                       // current version node
    // Copy of the current version's value (the initial value until the first write):
    // compared against to see fused writes change a value and unjournaled changes. See
    // NOTE [Reassigned values by reference] for when it is the holder itself.
    at::Tensor latest;
    bool latest_is_holder = false;
    size_t holder_fingerprint = 0;  // of `latest`'s bytes when it was reassigned
  };
  struct PendingWrite {
    int32_t buffer;
    WriteKind kind;
    int32_t written_tensor;  // -1: nested, fused, or several arguments wrote the buffer
    at::Tensor written;      // the argument written (kInplace)
  };

  // Whether versions keep their values (saved, or streamed to a sink).
  bool KeepsValues() const { return save_ || record_->streams(); }
  // The tensor the buffer's slot holds now: for an eager model, the last one assigned.
  at::Tensor SlotValue(const State& state) const {
    return eager_ ? state.holder : CurrentBuffer(*state.entry);
  }
  void SetHolder(int32_t buffer, const at::Tensor& tensor);
  void Reindex(int32_t buffer);  // after an op moved the holder (set_)
  void Unindex(int32_t buffer);  // drops it from the index of its holder's storage
  void OnReassign(int32_t buffer, const at::Tensor& tensor);
  // Another buffer than `buffer` whose registered tensor is `tensor`, or -1.
  int32_t OtherHolder(int32_t buffer, const at::Tensor& tensor) const;
  // Keeps the holder itself as `latest`, with its fingerprint, and makes `latest` a copy
  // again when its value as of then is needed (NOTE [Reassigned values by reference]).
  void KeepHolderAsLatest(State& state);
  void CopyLatest(State& state);
  int32_t AddVersion(int32_t buffer, std::optional<WriteKind> kind, const SourceRecord* producer,
                     at::Tensor value, std::optional<bool> changed);
  // Where a kInplace write of `pending` leaves the buffer: the output of `producer` that
  // returned it, or an alias write (NOTE [Buffer writes]) whose value, `value`, is saved
  // in `slot` or streamed.
  int32_t WrittenOutput(const PendingWrite& pending, int32_t producer,
                        c10::ArrayRef<c10::IValue> returns, int32_t slot, const at::Tensor& value);

  RecordAppender* record_;
  Tensors* tensors_;
  bool save_;
  bool eager_;  // ModelLayout::eager
  std::vector<State> buffers_;
  std::vector<int32_t> assigned_;  // buffers whose slot some method's code assigns
  absl::flat_hash_map<const c10::StorageImpl*, absl::InlinedVector<int32_t, 1>> storages_;
  absl::InlinedVector<PendingWrite, 4> pending_;
  bool restored_ = false;
};

}  // namespace torchlens

#endif  // TORCHLENS_DISPATCH_BUFFER_JOURNAL_H_
