// The autograd hooks of a capture with CaptureOptions::save_grads (NOTE [Gradients in a
// trace] in graph/gradients.h says what they collect and when).
//
// NOTE [Hooking the forward's autograd graph]
// Every value the capture records (RecordAppender::AddOutput) that requires grad names an
// autograd edge: its grad_fn and output number, or a leaf's accumulator. The first value on
// a node puts one pre-hook on it (FunctionPreHook: it reads the gradients autograd hands the
// node and returns them as they are); each hooked input of the node is a tensor of the
// store, shown on every trace node that holds that value (an op's output, the output node
// that returns it, the buffer version it became). The autograd nodes an op made are found
// by their sequence numbers, which autograd draws from one per-thread counter as it makes
// nodes: those reachable from the op's outputs and made since the previous op was recorded
// are that op's backward ops, hooked too, and linked to the nodes they feed. Parameters'
// accumulators are hooked when the capture starts (held until it ends, so that the forward's
// ops use the hooked ones), and so are buffers that require grad. Hooks are added, never
// removed: they live with the autograd graph and hold the store, not the trace.
#ifndef TORCHLENS_DISPATCH_GRADIENT_HOOKS_H_
#define TORCHLENS_DISPATCH_GRADIENT_HOOKS_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "graph/capture_record.h"
#include "graph/gradients.h"
#include "torchlens_dispatch/model_layout.h"

namespace torch::autograd {
struct Node;
}  // namespace torch::autograd

namespace torchlens {

class NodeHook;

class GradientHooks {
 public:
  // Hooks `layout`'s parameters and the buffers that require grad.
  explicit GradientHooks(const ModelLayout& layout);
  ~GradientHooks();
  GradientHooks(const GradientHooks&) = delete;
  GradientHooks& operator=(const GradientHooks&) = delete;

  // `value` was recorded as output `output` of node `node` of `record`.
  void OnValue(const CaptureRecord& record, int32_t node, int32_t output, const at::Tensor& value);

  // The end of the capture: buffer versions show the values they were made from, the
  // accumulators held since the start are let go, and the store goes to the trace.
  std::shared_ptr<GradientStore> Finish(const CaptureRecord& record);

 private:
  struct Hooked {
    std::weak_ptr<torch::autograd::Node> node;  // to tell a new node at a dead one's address
    NodeHook* hook = nullptr;                   // owned by the node
    int32_t id = -1;                            // its backward node in the store
  };
  // The hooked entry of `fn`, registering it first as a backward node of trace node
  // `forward_node` (or of the parameter at `address`).
  Hooked& Hook(const std::shared_ptr<torch::autograd::Node>& fn, int32_t forward_node,
               const std::string& address, bool may_begin);
  // Hooks the nodes op `node` made that are reachable from `fn`.
  void HookOpNodes(const std::shared_ptr<torch::autograd::Node>& fn, int32_t node);
  // The store's tensor for input `input_nr` of hooked node `hooked`.
  int32_t TensorOf(Hooked& hooked, uint32_t input_nr);

  std::shared_ptr<GradientStore> store_ = std::make_shared<GradientStore>();
  absl::flat_hash_map<const torch::autograd::Node*, Hooked> nodes_;
  std::vector<std::shared_ptr<torch::autograd::Node>> held_;  // accumulators, until Finish
  // Buffers that required grad when the capture started: (buffer, tensor, backward node).
  struct InitialBuffer {
    int32_t buffer;
    int32_t tensor;
    int32_t backward;
  };
  std::vector<InitialBuffer> initial_buffers_;
  // Autograd's sequence number when the last op was recorded, and where the op being
  // recorded began (NOTE [Hooking the forward's autograd graph]).
  uint64_t mark_ = 0;
  uint64_t op_start_ = 0;
  int32_t current_op_ = -1;
};

}  // namespace torchlens

#endif  // TORCHLENS_DISPATCH_GRADIENT_HOOKS_H_
