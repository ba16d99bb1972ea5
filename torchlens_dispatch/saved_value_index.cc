#include "torchlens_dispatch/saved_value_index.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/set.h>

#include <algorithm>

#include "torchlens_dispatch/ops/storage_ranges.h"

namespace torchlens {

void SavedValueIndex::IndexSavedValues() {
  for (const UnindexedValue& value : unindexed_) {
    storages_[value.storage].saved.push_back(value.saved);
  }
  unindexed_.clear();
}

void SavedValueIndex::IndexAlias(const at::Tensor& tensor, c10::StorageImpl* storage,
                                 StorageEntry** entry) {
  if (*entry == nullptr) {
    *entry = &storages_[storage];
    if (!(*entry)->pinned.has_value()) {  // NOTE [Dead views are written too]
      (*entry)->pinned.emplace(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(storage));
    }
  }
  std::vector<AliasedTensor>& aliased = (*entry)->aliased;
  for (const AliasedTensor& known : aliased) {
    // Its address is pinned: the same tensor.
    if (known.alive._unsafe_get_target() == tensor.unsafeGetTensorImpl()) return;
  }
  const auto [begin, end] = ByteRange(tensor);
  aliased.push_back(AliasedTensor{WeakImpl(tensor.getIntrusivePtr()), begin, end});
}

void SavedValueIndex::IndexAliases(const at::Tensor& view, c10::ArrayRef<at::Tensor> bases) {
  if (!view.defined() || !view.has_storage()) return;
  c10::StorageImpl* storage = view.storage().unsafeGetStorageImpl();
  StorageEntry* entry = nullptr;
  for (const at::Tensor& base : bases) {
    if (base.storage().unsafeGetStorageImpl() == storage) IndexAlias(base, storage, &entry);
  }
  if (entry != nullptr) IndexAlias(view, storage, &entry);  // a view of one of the bases
}

void SavedValueIndex::NoteMovedAlias(const at::Tensor& tensor) {
  const c10::TensorImpl* impl = tensor.unsafeGetTensorImpl();
  if (std::none_of(moved_aliases_.begin(), moved_aliases_.end(),
                   [&](const at::Tensor& t) { return t.unsafeGetTensorImpl() == impl; })) {
    moved_aliases_.push_back(tensor);
  }
}

void SavedValueIndex::IndexMovedAliases() {
  // See NOTE [Aliases change place].
  for (const at::Tensor& tensor : moved_aliases_) {
    if (!tensor.has_storage()) continue;
    StorageEntry* entry = nullptr;
    IndexAlias(tensor, tensor.storage().unsafeGetStorageImpl(), &entry);
  }
  moved_aliases_.clear();
}

at::Tensor SavedValueIndex::StreamedAlias(const c10::Storage& storage, int32_t slot) const {
  const StreamedSlot& streamed = streamed_slots_[slot];
  at::Tensor alias = at::empty({0}, at::TensorOptions().dtype(streamed.dtype));
  alias.set_(storage, streamed.geometry.storage_offset, streamed.geometry.sizes,
             streamed.geometry.strides);
  return alias;
}

}  // namespace torchlens
