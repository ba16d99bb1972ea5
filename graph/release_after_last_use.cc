#include "graph/release_after_last_use.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "graph/mapped_storage.h"

namespace torchlens {

ReleaseAfterLastUse::ReleaseAfterLastUse(size_t steps, TensorsOf tensors_of)
    : tensors_of_(std::move(tensors_of)) {
  std::vector<int32_t> readers;
  // (mapping, window position in it) -> window id, an index into windows_.
  absl::flat_hash_map<std::pair<const char*, size_t>, int32_t> window_index;
  std::vector<int32_t> storages_per_window;
  std::vector<int32_t> step_storages;
  for (size_t step = 0; step < steps; ++step) {
    step_storages.clear();
    tensors_of_(step, [&](const at::Tensor& t) {
      if (!t.defined() || !t.has_storage() || t.storage().nbytes() == 0) return;
      const std::optional<absl::string_view> mapping = MappingOf(t.storage());
      if (!mapping.has_value()) return;
      auto [it, added] = index_.try_emplace(t.storage().unsafeGetStorageImpl(),
                                            static_cast<int32_t>(storages_.size()));
      step_storages.push_back(it->second);
      if (!added) return;
      // See NOTE [Releasing after the last use]: windows count from the file's start.
      const size_t offset =
          static_cast<const char*>(t.storage().data_ptr().get()) - mapping->data();
      const size_t first = offset / kReleaseWindow;
      const size_t last = (offset + t.storage().nbytes() - 1) / kReleaseWindow;
      storages_.push_back(
          {static_cast<int32_t>(window_ids_.size()), static_cast<int32_t>(last - first + 1)});
      readers.push_back(0);
      for (size_t w = first; w <= last; ++w) {
        auto [window, new_window] = window_index.try_emplace(std::make_pair(mapping->data(), w),
                                                             static_cast<int32_t>(windows_.size()));
        if (new_window) {
          const size_t end = std::min(mapping->size(), (w + 1) * kReleaseWindow);
          windows_.push_back({mapping->data() + w * kReleaseWindow, mapping->data() + end});
          storages_per_window.push_back(0);
        }
        ++storages_per_window[window->second];
        window_ids_.push_back(window->second);
      }
    });
    std::sort(step_storages.begin(), step_storages.end());
    step_storages.erase(std::unique(step_storages.begin(), step_storages.end()),
                        step_storages.end());
    for (int32_t s : step_storages) ++readers[s];
  }
  readers_left_ = std::make_unique<std::atomic<int32_t>[]>(readers.size());
  for (size_t s = 0; s < readers.size(); ++s) readers_left_[s].store(readers[s]);
  storages_left_ = std::make_unique<std::atomic<int32_t>[]>(storages_per_window.size());
  for (size_t w = 0; w < storages_per_window.size(); ++w) {
    storages_left_[w].store(storages_per_window[w]);
  }
}

std::vector<int32_t> ReleaseAfterLastUse::StoragesOf(size_t step) const {
  std::vector<int32_t> found;
  tensors_of_(step, [&](const at::Tensor& t) {
    if (!t.defined() || !t.has_storage()) return;
    auto it = index_.find(t.storage().unsafeGetStorageImpl());
    if (it != index_.end()) found.push_back(it->second);
  });
  std::sort(found.begin(), found.end());
  found.erase(std::unique(found.begin(), found.end()), found.end());
  return found;
}

void ReleaseAfterLastUse::Done(size_t step) {
  if (index_.empty()) return;  // nothing mapped: a trace held in memory
  for (int32_t s : StoragesOf(step)) {
    // See NOTE [Releasing after the last use].
    if (readers_left_[s].fetch_sub(1, std::memory_order_acq_rel) != 1) continue;
    const Storage& storage = storages_[s];
    for (int32_t k = storage.first_window; k < storage.first_window + storage.num_windows; ++k) {
      const int32_t w = window_ids_[k];
      if (storages_left_[w].fetch_sub(1, std::memory_order_acq_rel) == 1) {
        ReleaseMappedPages(windows_[w].begin, windows_[w].end);
      }
    }
  }
}

}  // namespace torchlens
