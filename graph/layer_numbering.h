// TorchLens' layer numbers, given in one place to the trace builder and to a capture that
// needs labels while it runs (selective saving and early stop by label).
//
// A layer's `type_index` counts the layers of its type and its `step_index` all layers,
// both from 1 in order of first execution; `pass` counts the executions of one layer. The
// label of an execution is "{type}_{type_index}_{step_index}:{pass}" (LayerPassLabel).
#ifndef TORCHLENS_GRAPH_LAYER_NUMBERING_H_
#define TORCHLENS_GRAPH_LAYER_NUMBERING_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"

namespace torchlens {

class LayerNumbering {
 public:
  struct Numbers {
    int type_index = 0;
    int step_index = 0;
    int pass = 0;
  };

  // Room for `layers` layer ids, so that numbering does not reallocate.
  void Reserve(size_t layers) { layers_.reserve(layers); }

  // A dense id for an op type ("relu"): operators of one type (aten::add.Tensor and
  // aten::add.Scalar) share the count of layers of that type.
  int32_t TypeId(absl::string_view type);

  // The numbers of the next execution of layer `layer` (a dense id; negative for a layer
  // of its own) of type `type_id`.
  Numbers Next(int32_t layer, int32_t type_id);

 private:
  struct Layer {
    int type_index = 0;
    int step_index = 0;
    int passes = 0;
  };
  absl::flat_hash_map<std::string, int32_t> type_ids_;
  std::vector<int> layers_of_type_;
  std::vector<Layer> layers_;
  int steps_ = 0;
};

}  // namespace torchlens

#endif  // TORCHLENS_GRAPH_LAYER_NUMBERING_H_
