#include "tools/bench_memory.h"

#include "absl/container/flat_hash_set.h"
#include "torchlens_dispatch/ops/ivalue_tensors.h"

namespace torchlens {

int64_t SavedBytes(const Trace& trace) {
  absl::flat_hash_set<const void*> excluded;
  for (const Op& op : trace.ops()) {
    if (op.is_input() && op.out.defined()) excluded.insert(op.out.storage().unsafeGetStorageImpl());
    int index = 0;
    for (const c10::IValue& arg : op.creation_args) {
      ForEachTensor(arg, [&](const at::Tensor& t) {
        if (index < static_cast<int>(op.arg_sources.size()) && t.defined() && t.has_storage() &&
            op.arg_sources[index].kind == ArgSource::Kind::kParam) {
          excluded.insert(t.storage().unsafeGetStorageImpl());
        }
        ++index;
      });
    }
  }
  absl::flat_hash_set<const void*> counted;
  int64_t bytes = 0;
  auto count = [&](const at::Tensor& t) {
    if (!t.defined() || !t.has_storage()) return;
    const void* storage = t.storage().unsafeGetStorageImpl();
    if (excluded.contains(storage) || !counted.insert(storage).second) return;
    bytes += static_cast<int64_t>(t.storage().nbytes());
  };
  for (const Op& op : trace.ops()) {
    for (const at::Tensor& t : op.outs) count(t);
    count(op.out);
    count(op.rng_state);
    for (const c10::IValue& arg : op.creation_args) ForEachTensor(arg, count);
  }
  for (const auto& [address, buffer] : trace.buffers()) count(buffer.initial_value);
  return bytes;
}

}  // namespace torchlens
