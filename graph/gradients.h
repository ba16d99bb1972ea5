// Where a captured trace's gradients are kept while autograd computes them.
//
// NOTE [Gradients in a trace]
// A capture with CaptureOptions::save_grads hooks the autograd graph of the forward it
// records (torchlens_dispatch/gradient_hooks.h): a pre-hook on the autograd node of every
// value it records that requires grad (an op's outputs, an input, a buffer's initial value,
// a parameter's accumulator), which reads the gradient autograd hands that node and returns
// it unchanged, so that autograd computes exactly what it computes without them. The hooks
// write into this store, which the trace owns with them; it fills the trace's `Op::grad`,
// `Op::grads`, `Trace::backward_ops()` and `Trace::param_grads()`.
//   * A backward() (or autograd::grad) whose graph runs through the trace's nodes is one
//     backward call. Its gradients are complete when it returns: the store marks its end
//     from a callback autograd runs when the call finishes. Each call that reaches the
//     trace replaces what the previous one left (it does not add, as `.grad` does): the
//     gradients and backward ops are always those of one call. A trace whose outputs never
//     get a backward keeps every gradient undefined.
//   * Hooks may run on any thread (a backward on another thread, a reentrant backward
//     past autograd's depth limit): the store takes a lock. Read the gradients after the
//     backward returned; reading them while it runs reads values being written.
//   * A call only begins at a node the forward's ops made. A parameter's accumulator is
//     shared with any later forward that runs while this graph is alive: a backward that
//     reaches it without passing through the trace's ops is not this trace's, and is
//     ignored.
//   * The store fills the trace it was made for, once that trace's graph exists (before,
//     it keeps what arrives); copies of the trace keep the gradients they were made with.
//     When the trace is destroyed the store detaches, and hooks that run later do nothing.
#ifndef TORCHLENS_GRAPH_GRADIENTS_H_
#define TORCHLENS_GRAPH_GRADIENTS_H_

#include <ATen/core/DimVector.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "graph/trace.h"

namespace torchlens {

class GradientStore {
 public:
  GradientStore() = default;
  GradientStore(const GradientStore&) = delete;
  GradientStore& operator=(const GradientStore&) = delete;

  // While capturing (the capturing thread).
  // A value whose gradient a hook reports (one autograd edge: a node and its input); its id.
  int32_t AddTensor();
  // Output `output` of trace node `node` holds tensor `tensor`'s value.
  void AddTarget(int32_t tensor, int32_t node, int32_t output);
  // Tensor `tensor` is the parameter at `address`.
  void SetParam(int32_t tensor, std::string address);
  // An autograd node named `name` ("AddmmBackward0"), made by trace node `forward_node`, or
  // accumulating into it (-1 and `address` for a parameter's accumulator); its id.
  // `may_begin`: reaching it begins a backward call of this trace.
  int32_t AddBackwardNode(std::string name, int32_t forward_node, std::string address,
                          bool may_begin);
  // Gradient flows from backward node `from` into backward node `to`.
  void AddBackwardEdge(int32_t from, int32_t to);
  // Backward node `backward_node` belongs to trace node `forward_node` (known at the end of
  // capture for a buffer's initial value).
  void SetForwardNode(int32_t backward_node, int32_t forward_node);
  // Trace node `node` holds the value of output `of_output` of node `of` (a buffer version
  // that an op's output became): it shows that value's gradient.
  struct Alias {
    int32_t node;
    int32_t of;
    int32_t of_output;
  };
  void AddAliases(const std::vector<Alias>& aliases);

  // From the hooks (any thread). Backward node `node` runs now in the backward call `task`
  // (autograd's graph task), receiving `grads` (its input gradients); `inputs[k]` is the
  // tensor hooked on its input k (-1: none). Returns whether this began a call, for which
  // the caller has `End(task)` run when the call finishes. A node of another call than the
  // one running begins a new one if it may (`AddBackwardNode`), and is ignored otherwise.
  bool OnNode(int32_t node, const void* task, const std::vector<at::Tensor>& grads,
              const std::vector<int32_t>& inputs);
  // The backward call `task` finished.
  void End(const void* task);

  // The trace's side. The trace whose graph is `ops` (with its backward ops and parameter
  // gradients) is filled from now on, with what arrived so far.
  void Attach(std::vector<Op>* ops, std::vector<Op>* backward_ops,
              std::map<std::string, at::Tensor>* param_grads);
  // That trace goes away (a no-op when another one is attached).
  void Detach(const std::vector<Op>* ops);

 private:
  struct Target {
    int32_t node;
    int32_t output;
  };
  struct Tensor {
    std::vector<Target> targets;
    std::string param;  // a parameter's address, or empty
    at::Tensor grad;    // from the running or latest call
  };
  struct BackwardNode {
    std::string name;
    int32_t forward_node;
    std::string address;
    bool may_begin;
    std::vector<int32_t> next;  // backward nodes gradient flows into
    // In the running or latest call: its position in execution order (-1: it did not run),
    // and its first input gradient's shape and dtype.
    int32_t ran = -1;
    at::DimVector shape;  // inline: no allocation per node in the backward
    c10::ScalarType dtype = c10::ScalarType::Undefined;
  };
  // Clears the previous call's gradients (the store's and the attached trace's).
  void BeginLocked(const void* task);
  // Writes tensor `tensor`'s gradient into the attached trace.
  void ApplyLocked(const Tensor& tensor);
  // The attached trace's backward ops, from the nodes that ran.
  void BuildBackwardOpsLocked();

  mutable std::mutex mu_;
  std::vector<Tensor> tensors_;
  std::vector<BackwardNode> nodes_;
  std::vector<int32_t> executed_;  // backward nodes, in execution order
  const void* task_ = nullptr;     // the call running, or null
  bool running_ = false;
  bool ran_once_ = false;
  bool detached_ = false;
  std::vector<Op>* ops_ = nullptr;
  std::vector<Op>* backward_ops_ = nullptr;
  std::map<std::string, at::Tensor>* param_grads_ = nullptr;
};

}  // namespace torchlens

#endif  // TORCHLENS_GRAPH_GRADIENTS_H_
