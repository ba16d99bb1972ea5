// Where a tensor lies in its storage, in elements: what a trace records of the tensors an
// op wrote through views (graph/trace.h AliasWrite), and what replay needs to redo such a
// write (storage_ranges.h).
#ifndef TORCHLENS_DISPATCH_OPS_TENSOR_GEOMETRY_H_
#define TORCHLENS_DISPATCH_OPS_TENSOR_GEOMETRY_H_

#include <cstdint>
#include <vector>

namespace torchlens {

struct TensorGeometry {
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  int64_t storage_offset = 0;
};

}  // namespace torchlens

#endif  // TORCHLENS_DISPATCH_OPS_TENSOR_GEOMETRY_H_
