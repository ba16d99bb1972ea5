// Where each user-level op of a capture belongs: the innermost module that runs it and its
// layer (NOTE [Layers and passes] in script_sites.h), for the three kinds of model.
//
//   * TorchScript: the interpreter's module hierarchy and source ranges (ScriptSites), or
//     the marker torchlens put before the node in its private plan.
//   * Eager (Python): the module call the front-end opened (eager_scope.h); a layer is
//     (module, operator, position of the op in the module's call), so a module called
//     again gives the next pass of its layers.
//   * torch::nn (C++): no call hooks, so the module owning the first parameter or buffer
//     the op reads; a layer is (module, operator).
// An op of the root module outside TorchScript code is a layer of its own.
//
//   OpPlacement placement(*layout);
//   OpPlacement::Place place = placement.Locate(symbol, op_index, owner_module, &owners);
#ifndef TORCHLENS_DISPATCH_OP_PLACEMENT_H_
#define TORCHLENS_DISPATCH_OP_PLACEMENT_H_

#include <ATen/core/interned_strings.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "graph/trace.h"
#include "torchlens_dispatch/model_layout.h"
#include "torchlens_dispatch/script_sites.h"

namespace torchlens {

class OpPlacement {
 public:
  // Reserves as much as the last capture of the model used (ModelLayout::CaptureSizes).
  explicit OpPlacement(const ModelLayout& layout);
  OpPlacement(const OpPlacement&) = delete;
  OpPlacement& operator=(const OpPlacement&) = delete;

  struct Place {
    int32_t module = 0;  // a ModuleAddresses id
    int32_t layer = 0;   // layers are numbered from 0 in order of first use
    // For the first op of its layer: where it is in the model's code (NOTE [Source
    // positions]), or null.
    const SourcePosition* first_position = nullptr;
    bool new_layer = false;
  };
  // The place of the op being recorded, whose operator is `symbol` (its index among the
  // capture's operators `op_index`); `owner_module` is the module owning the first
  // parameter or buffer it reads, or -1. A new layer's position's owner is added to
  // `position_owners` (NOTE [Source positions]).
  Place Locate(c10::Symbol symbol, int32_t op_index, int32_t owner_module,
               std::vector<std::shared_ptr<const void>>* position_owners);

  // Eager models: the call of the module with this identity opens, and the innermost open
  // call closes. EnterModule returns false (and opens nothing) for a module the model does
  // not have, and for the module already innermost (its forward calling its own forward).
  bool EnterModule(const void* module);
  void ExitModule();

  // Whether module `inner` lies inside module `outer` (the root holds every module).
  bool IsWithin(int32_t inner, int32_t outer) const;
  // The address of module `id`, an id Locate gave.
  const std::string& Address(int32_t id) const { return addresses_.Address(id); }

  int32_t num_layers() const { return next_layer_; }
  int64_t marked_sites() const { return script_sites_.marked(); }
  int64_t interpreter_sites() const { return script_sites_.asked(); }
  // Module addresses the interpreter named that the layout does not have, after its own.
  std::vector<std::string> ReleaseExtraAddresses() { return addresses_.ReleaseExtra(); }
  // For the next capture's reservations.
  void StoreSizes(ModelLayout::CaptureSizes* sizes) const;

 private:
  // Eager models: the open call's module and the op's position in it.
  ScriptSite EagerSite();
  int32_t LayerOf(int32_t module, int32_t op_index, const ScriptSite& site);

  const ModelLayout& layout_;
  ModuleAddresses addresses_;
  ScriptSites script_sites_;  // reads addresses_
  struct OpenCall {
    int32_t module;
    uint32_t ops;  // run in it so far
  };
  std::vector<OpenCall> open_calls_;  // eager models, innermost last
  struct LayerKey {
    int32_t module;
    int32_t op;
    uint64_t position;
    bool operator==(const LayerKey& other) const {
      return module == other.module && op == other.op && position == other.position;
    }
    template <typename H>
    friend H AbslHashValue(H h, const LayerKey& key) {
      return H::combine(std::move(h), key.module, key.op, key.position);
    }
  };
  absl::flat_hash_map<LayerKey, int32_t> layers_;
  std::vector<int32_t> layer_of_class_;  // by NOTE [Layer classes] number; -1: not run yet
  int32_t next_layer_ = 0;
};

}  // namespace torchlens

#endif  // TORCHLENS_DISPATCH_OP_PLACEMENT_H_
