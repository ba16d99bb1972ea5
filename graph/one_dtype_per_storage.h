// Tensors LibTorch's pickler would write in a form that does not read back as their values.
//
// NOTE [One dtype per storage]
// LibTorch's pickler writes each storage once, typed by the dtype of the first tensor it
// meets on it. A tensor of another dtype on the same storage (`torch.view_as_real` of a
// complex op output, `view_as_complex` of a float one, `.view(dtype)`) would be read back
// through the wrong type: Python's torch.load fails or returns other values. Such a
// tensor is written as a copy with a storage of its own. The pickler also writes a
// tensor's storage, geometry and dtype but not its lazy conjugate or negative bit
// (`c.conj()` of a complex tensor is a view that reads its storage conjugated): such a
// tensor is written as a copy with the bit applied, so that it reads back as the values
// it held. The trace is not changed: a list or tuple holding such a tensor is copied,
// not written.
#ifndef TORCHLENS_GRAPH_ONE_DTYPE_PER_STORAGE_H_
#define TORCHLENS_GRAPH_ONE_DTYPE_PER_STORAGE_H_

#include <ATen/core/ivalue.h>

#include <optional>

#include "absl/container/flat_hash_map.h"

namespace torchlens {

// One use per value pickled: it remembers the dtype each storage was first met with.
class OneDtypePerStorage {
 public:
  // `value` with such tensors copied, or nullopt when it holds none.
  std::optional<c10::IValue> Separate(const c10::IValue& value);

 private:
  absl::flat_hash_map<const c10::StorageImpl*, c10::ScalarType> dtypes_;
};

}  // namespace torchlens

#endif  // TORCHLENS_GRAPH_ONE_DTYPE_PER_STORAGE_H_
