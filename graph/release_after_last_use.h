// Giving back a mapped trace's pages as a walk over its ops finishes with them, so that the
// walk's resident set is its working set, not the file (NOTE [Giving back a mapped value's
// pages] in graph/mapped_storage.h).
//
//   ReleaseAfterLastUse pages(trace.ops().size(), [&](size_t i, const TensorVisitor& visit) {
//     for (const at::Tensor& t : trace.ops()[i].outs) visit(t);  // what step i reads
//   });
//   for (size_t i = 0; i < trace.ops().size(); ++i) { ...read op i...; pages.Done(i); }
#ifndef TORCHLENS_GRAPH_RELEASE_AFTER_LAST_USE_H_
#define TORCHLENS_GRAPH_RELEASE_AFTER_LAST_USE_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Storage.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace torchlens {

using TensorVisitor = std::function<void(const at::Tensor&)>;

// NOTE [Releasing after the last use]
// A walk declares, for each of its steps, the tensors the step reads. Counting, per mapped
// storage, the steps that read it, the walk is done with a storage when the last of those
// steps is done. The file is given back in windows of kReleaseWindow bytes from its start
// (NOTE [Giving back a mapped value's pages]): a window once no storage it overlaps is
// still to be read. A storage read again after that (by code outside the declared steps)
// is read from disk again, which costs time, never correctness. Only storages made over a
// mapped file are counted, so a walk over a trace held in memory pays one scan of its
// tensors and nothing per step. Steps may be done in any order and on any thread.
class ReleaseAfterLastUse {
 public:
  // `tensors_of(step, visit)` calls `visit` for each tensor step `step` reads (repeats are
  // fine); it is called once per step here and once more by Done.
  using TensorsOf = std::function<void(size_t step, const TensorVisitor& visit)>;
  ReleaseAfterLastUse(size_t steps, TensorsOf tensors_of);

  // Step `step` is done: gives back each window of the file that no step left reads (see
  // the NOTE). Call once per step. Thread-safe.
  void Done(size_t step);

 private:
  // The distinct mapped storages step `step` reads, as indices into `storages_`.
  std::vector<int32_t> StoragesOf(size_t step) const;

  struct Window {
    const char* begin;
    const char* end;
  };
  struct Storage {
    int32_t first_window;  // the ids of the windows it overlaps, consecutive in `window_ids_`
    int32_t num_windows;
  };

  TensorsOf tensors_of_;
  absl::flat_hash_map<const c10::StorageImpl*, int32_t> index_;
  std::vector<Storage> storages_;
  std::vector<Window> windows_;      // by window id, each window once
  std::vector<int32_t> window_ids_;  // each storage's window ids, in storage order
  std::unique_ptr<std::atomic<int32_t>[]> readers_left_;   // per storage
  std::unique_ptr<std::atomic<int32_t>[]> storages_left_;  // per window id: storages to read
};

}  // namespace torchlens

#endif  // TORCHLENS_GRAPH_RELEASE_AFTER_LAST_USE_H_
