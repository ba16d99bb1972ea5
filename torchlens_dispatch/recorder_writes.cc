// Recorder: copy-on-write of saved values before in-place writes, and the alias writes of
// the tensors those writes changed (NOTE [Writes through views] in saved_value_index.h).
#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/set.h>

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "torchlens_dispatch/ops/saved_copy.h"
#include "torchlens_dispatch/ops/storage_ranges.h"
#include "torchlens_dispatch/recorder.h"

namespace torchlens {

int32_t Recorder::SaveStreamed(const at::Tensor& tensor, const c10::TensorImpl* live) {
  // NOTE [Streaming identity]
  // A streaming capture keeps no value, yet its graph must be the one a capture in memory
  // records, whose saved values keep every tensor (and storage) they came from alive: a
  // temporary view that a later write changes still gets its alias write there. So each
  // value gets a slot, empty, with the geometry the value had, indexed by storage as saved
  // values are (NOTE [Writes through views]), and the capture pins, weakly, each
  // TensorImpl and StorageImpl it indexes: their memory is not handed to a new tensor
  // before the capture ends (their data is freed as usual), so an entry of a dead tensor
  // stays valid, as it does in memory. A write over a streamed slot's bytes records the
  // alias write with the value read through a tensor made over the written storage with
  // the slot's geometry (StreamedAlias), which is what the saved value would show.
  const int32_t slot = record_.AddSlot(at::Tensor());
  if (static_cast<size_t>(slot) >= index_.streamed_slots().size())
    index_.streamed_slots().resize(slot + 1);
  index_.streamed_slots()[slot] =
      StreamedSlot{ByteRange(tensor), GeometryOf(tensor), tensor.scalar_type()};
  if (tensor.has_storage()) {
    c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
    StorageEntry& entry = index_.storages()[storage];
    if (!entry.pinned.has_value()) {
      entry.pinned.emplace(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(storage));
    }
    entry.saved.push_back(SavedValue{slot, live != nullptr ? live : tensor.unsafeGetTensorImpl()});
  }
  return slot;
}

void Recorder::RecordAliasWrites(int32_t writer) {
  // See NOTE [Writes through views]. In the order the earlier values were made, which is
  // the same whichever of them were saved (the two indexes are searched one after the
  // other).
  if (index_.overwritten().size() > 1) {
    std::stable_sort(index_.overwritten().begin(), index_.overwritten().end(),
                     [](const OverwrittenValue& a, const OverwrittenValue& b) {
                       return std::make_pair(a.node_before, a.output_before) <
                              std::make_pair(b.node_before, b.output_before);
                     });
  }
  for (OverwrittenValue& overwritten : index_.overwritten()) {
    const SavedValue& saved = overwritten.saved;
    TensorEntry* entry = Find(saved.tensor, overwritten.pinned);
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
    AliasWriteRecord write;
    write.before = before;
    write.written_tensor = overwritten.written_tensor;
    if (overwritten.alias.defined()) {
      write.aliased = GeometryOf(overwritten.alias);
      write.slot = Save(overwritten.alias, saved.tensor);
    }
    write.written = std::move(overwritten.written);
    const int32_t slot = write.slot;
    const int32_t output = record_.AddAliasWrite(writer, std::move(write), overwritten.alias);
    entry = Find(saved.tensor, overwritten.pinned);  // Save may have grown the table
    entry->node = writer;
    entry->output_index = output;
    entry->slot = slot;
  }
  for (const OverwrittenValue& overwritten : index_.overwritten()) {
    std::vector<std::pair<int32_t, int32_t>>& written_inputs = record_.record().written_inputs;
    if (overwritten.node_before >= 0 &&
        record_.node(overwritten.node_before).kind == NodeRecord::Kind::kInput) {
      const std::pair<int32_t, int32_t> written{overwritten.node_before, writer};
      if (std::find(written_inputs.begin(), written_inputs.end(), written) ==
          written_inputs.end()) {
        written_inputs.push_back(written);
      }
    }
  }
  index_.overwritten().clear();
}

void Recorder::PrepareStreamedParameterWrite(const at::Tensor& tensor, int32_t written_tensor,
                                             StorageEntry* storage) {
  // See NOTE [Parameters written through views].
  const int32_t param = storage->streamed_param;
  storage->streamed_param = -1;
  const ModelLayout::ParamEntry& layout = layout_->params[param];
  params_.BeforeWrite(layout.saved);
  const c10::TensorImpl* impl = layout.tensor.unsafeGetTensorImpl();
  if (tensor.unsafeGetTensorImpl() == impl) return;  // the op returns it: its output
  TensorEntry* entry = Lookup(impl);
  if (entry == nullptr || entry->param != param) return;
  entry->node = AddWrittenParameterNode(param, -1);
  entry->param = -1;
  // Its earlier value had no node (-1), as with saved values.
  index_.overwritten().push_back(OverwrittenValue{
      SavedValue{-1, impl}, layout.saved, written_tensor, GeometryOf(tensor), -1, 0, at::Tensor()});
}

bool Recorder::AloneOnUnknownStorage(const at::Tensor& tensor) const {
  // See NOTE [Writes into memory no saved value shares].
  return tensor.storage().use_count() == 1 && !tensors_.contains(tensor.unsafeGetTensorImpl());
}

void Recorder::PrepareWrite(const at::Tensor& tensor, WriteKind kind, int32_t written_tensor) {
  if (!tensor.defined() || !tensor.has_storage()) return;
  if (C10_UNLIKELY(policy_.may_halt())) params_.KeepBeforeHalt(tensor);
  journal_.NoteWrite(tensor, kind, written_tensor);
  if (params_.any_read()) KeepWrittenParameters(tensor);  // NOTE [Parameters read by reference]
  if (!index_.unindexed().empty() && !AloneOnUnknownStorage(tensor)) index_.IndexSavedValues();
  auto it = index_.storages().find(tensor.storage().unsafeGetStorageImpl());
  if (it == index_.storages().end()) return;
  StorageEntry& storage = it->second;
  if (C10_UNLIKELY(storage.streamed_param >= 0)) {
    PrepareStreamedParameterWrite(tensor, written_tensor, &storage);
  }
  const std::pair<int64_t, int64_t> range = ByteRange(tensor);
  if (!storage.saved.empty()) {
    // NOTE [Copy-on-write of saved values], NOTE [Writes through views]: saved values whose
    // bytes the write may touch are copied and noted; the others stay shared.
    std::optional<TensorGeometry> written;
    size_t kept = 0;
    for (const SavedValue& saved : storage.saved) {
      at::Tensor& value = record_.slot(saved.slot);
      if (saved.tensor != tensor.unsafeGetTensorImpl() &&
          !Overlap(
              policy_.streaming() ? index_.streamed_slots()[saved.slot].bytes : ByteRange(value),
              range)) {
        storage.saved[kept++] = saved;
        continue;
      }
      if (!written.has_value()) written = GeometryOf(tensor);
      // Its address is the saved tensor's (NOTE [Address reuse in unsaved mode]), which may
      // be dead: not read.
      TensorEntry* entry = Find(saved.tensor, /*pinned=*/true);
      // A streamed value needs no copy: the sink has had it (NOTE [Streaming identity]).
      index_.overwritten().push_back(OverwrittenValue{
          saved, policy_.streaming() ? index_.StreamedAlias(tensor.storage(), saved.slot) : value,
          written_tensor, *written, entry != nullptr ? entry->node : -1,
          entry != nullptr ? entry->output_index : 0, at::Tensor(), /*pinned=*/true});
      if (!policy_.streaming()) {
        value = CopyOfSaved(value);
        ++record_.record().stats.copy_on_write_clones;
      }
      if (entry != nullptr && entry->param >= 0) storage.written_param = true;
      if (entry != nullptr && entry->param >= 0 && entry->node < 0 && entry->slot == saved.slot &&
          saved.tensor != tensor.unsafeGetTensorImpl()) {
        // See NOTE [Parameters written through views].
        entry->node = AddWrittenParameterNode(entry->param, saved.slot);
        entry->param = -1;
      }
    }
    storage.saved.resize(kept);
  }
  // Without saved values: the same notes, with no value to copy, for the aliases, dead
  // ones included (NOTE [Dead views are written too]). The written tensor leaves the
  // index until the op has run, as its saved value would (NOTE [Aliases change place]).
  const c10::TensorImpl* written_impl = tensor.unsafeGetTensorImpl();
  size_t kept = 0;
  for (size_t i = 0; i < storage.aliased.size(); ++i) {
    AliasedTensor& aliased = storage.aliased[i];
    const c10::TensorImpl* impl = aliased.alive._unsafe_get_target();
    if (Overlap({aliased.begin_byte, aliased.end_byte}, range)) {
      c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl> held = aliased.alive.lock();
      const bool dead = !held;
      const TensorEntry* entry = Find(impl, dead);
      // Before a parameter's node is made below, as with saved values.
      const int32_t node_before = entry != nullptr ? entry->node : -1;
      const int32_t output_before = entry != nullptr ? entry->output_index : 0;
      if (entry == nullptr && !dead && impl != written_impl) {
        // Parameters are not in the table without saved values: NOTE [Parameters written
        // through views].
        if (const int32_t param = params_.IdOf(impl); param >= 0) {
          TensorEntry written_param;
          written_param.node = AddWrittenParameterNode(param, -1);
          Remember(at::Tensor(held), std::move(written_param));
        }
      }
      index_.overwritten().push_back(OverwrittenValue{
          SavedValue{-1, impl}, at::Tensor(), written_tensor, TensorGeometry{}, node_before,
          output_before, dead ? at::Tensor() : at::Tensor(std::move(held)), dead});
    }
    if (impl == written_impl) {
      index_.NoteMovedAlias(tensor);
      continue;  // dropped: IndexMovedAliases indexes it again
    }
    if (kept != i) storage.aliased[kept] = std::move(aliased);
    ++kept;
  }
  storage.aliased.erase(storage.aliased.begin() + kept, storage.aliased.end());
}

void Recorder::PrepareInplaceView(const at::Tensor& tensor, int32_t written_tensor) {
  // See NOTE [In-place view ops].
  if (!tensor.defined() || !tensor.has_storage()) return;
  journal_.NoteGeometryChange(tensor, written_tensor);
  index_.IndexSavedValues();
  auto it = index_.storages().find(tensor.storage().unsafeGetStorageImpl());
  if (it == index_.storages().end()) return;
  StorageEntry& storage = it->second;
  const c10::TensorImpl* impl = tensor.unsafeGetTensorImpl();
  size_t kept = 0;
  for (const SavedValue& saved : storage.saved) {
    at::Tensor& value = record_.slot(saved.slot);
    // A detached alias saved in its place (NOTE [Address reuse in unsaved mode]) keeps its
    // geometry, and the bytes it shares: it stays indexed.
    if (saved.tensor != impl || (!policy_.streaming() && value.unsafeGetTensorImpl() != impl)) {
      storage.saved[kept++] = saved;
      continue;
    }
    if (!policy_.streaming()) {  // a streamed value needs no copy (NOTE [Streaming identity])
      value = CopyOfSaved(value);
      ++record_.record().stats.copy_on_write_clones;
    }
  }
  storage.saved.resize(kept);
  const auto moved = std::find_if(
      storage.aliased.begin(), storage.aliased.end(),
      [&](const AliasedTensor& aliased) { return aliased.alive._unsafe_get_target() == impl; });
  if (moved == storage.aliased.end()) return;
  storage.aliased.erase(moved);
  index_.NoteMovedAlias(tensor);
}

}  // namespace torchlens
