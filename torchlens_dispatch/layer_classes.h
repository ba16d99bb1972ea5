// Numbers the layers of a model's TorchScript code once per model layout, so that a
// capture finds an op's layer by index rather than by hashing.
#ifndef TORCHLENS_DISPATCH_LAYER_CLASSES_H_
#define TORCHLENS_DISPATCH_LAYER_CLASSES_H_

#include <ATen/core/interned_strings.h>

#include <cstdint>
#include <mutex>
#include <tuple>

#include "absl/container/flat_hash_map.h"

namespace torchlens {

// NOTE [Layer classes]
// A marked site's layer key (its module, operator and position: NOTE [Layers and passes])
// is fixed for a model layout, and sites that share a key (one module's code inlined at
// two call sites) are one layer. The layout numbers the distinct keys once, when a site is
// first resolved against it; the site caches its number, and each capture maps numbers to
// its own layer ids through a dense vector read in execution order: a hash-table probe
// misses the cache on every op of a model larger than the cache.
class LayerClasses {
 public:
  LayerClasses() = default;
  LayerClasses(const LayerClasses&) = delete;
  LayerClasses& operator=(const LayerClasses&) = delete;

  // The number of the key, from 0 in order of first request. Thread-safe: the captures of
  // one model share its layout.
  int32_t Number(int32_t module, c10::Symbol op, uint64_t position);

 private:
  std::mutex mutex_;
  absl::flat_hash_map<std::tuple<int32_t, uint32_t, uint64_t>, int32_t> numbers_;
};

}  // namespace torchlens

#endif  // TORCHLENS_DISPATCH_LAYER_CLASSES_H_
