#include "torchlens_dispatch/gradient_hooks.h"

#include <ATen/SequenceNumber.h>
#include <torch/csrc/autograd/edge.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/variable.h>

#include <limits>
#include <utility>

namespace torchlens {

// See NOTE [Hooking the forward's autograd graph]: one per hooked autograd node.
class NodeHook final : public torch::autograd::FunctionPreHook {
 public:
  NodeHook(std::shared_ptr<GradientStore> store, int32_t id, size_t num_inputs)
      : store_(std::move(store)), id_(id), inputs_(num_inputs, -1) {}

  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    // The running backward call: autograd's graph task on this thread.
    const void* task = torch::autograd::get_current_graph_task_nodes_in_graph();
    if (store_->OnNode(id_, task, grads, inputs_)) {
      // Gradients are complete when the call finishes (NOTE [Gradients in a trace]).
      std::weak_ptr<GradientStore> store = store_;
      torch::autograd::Engine::get_default_engine().queue_callback([store, task] {
        if (std::shared_ptr<GradientStore> alive = store.lock()) alive->End(task);
      });
    }
    return grads;
  }

  std::vector<int32_t>& inputs() { return inputs_; }

 private:
  std::shared_ptr<GradientStore> store_;
  int32_t id_;
  std::vector<int32_t> inputs_;  // the store's tensor on each input, -1 when none
};

namespace {

// "AddmmBackward0"; LibTorch's own nodes name themselves with their namespace
// ("torch::autograd::AccumulateGrad").
std::string NodeName(const torch::autograd::Node& node) {
  std::string name = node.name();
  const size_t colon = name.rfind("::");
  return colon == std::string::npos ? name : name.substr(colon + 2);
}

// Autograd's accumulators (and nodes no op numbers) carry the largest sequence number.
constexpr uint64_t kUnnumbered = std::numeric_limits<uint64_t>::max();

}  // namespace

GradientHooks::GradientHooks(const ModelLayout& layout) : mark_(at::sequence_number::peek()) {
  for (const ModelLayout::ParamEntry& param : layout.params) {
    if (!param.tensor.defined() || !param.tensor.requires_grad()) continue;
    const torch::autograd::Edge edge = torch::autograd::impl::gradient_edge(param.tensor);
    if (!edge.function) continue;
    held_.push_back(edge.function);
    Hooked& hooked = Hook(edge.function, -1, param.address, /*may_begin=*/false);
    store_->SetParam(TensorOf(hooked, edge.input_nr), param.address);
  }
  for (size_t b = 0; b < layout.buffers.size(); ++b) {
    const at::Tensor buffer = CurrentBuffer(layout.buffers[b]);
    if (!buffer.defined() || !buffer.requires_grad()) continue;
    const torch::autograd::Edge edge = torch::autograd::impl::gradient_edge(buffer);
    if (!edge.function) continue;
    held_.push_back(edge.function);
    Hooked& hooked = Hook(edge.function, -1, std::string(), /*may_begin=*/false);
    initial_buffers_.push_back(
        InitialBuffer{static_cast<int32_t>(b), TensorOf(hooked, edge.input_nr), hooked.id});
  }
}

GradientHooks::~GradientHooks() = default;

GradientHooks::Hooked& GradientHooks::Hook(const std::shared_ptr<torch::autograd::Node>& fn,
                                           int32_t forward_node, const std::string& address,
                                           bool may_begin) {
  auto [it, inserted] = nodes_.try_emplace(fn.get());
  Hooked& hooked = it->second;
  if (!inserted && !hooked.node.expired()) return hooked;
  hooked = Hooked();  // new, or a new node at a dead one's address
  hooked.node = fn;
  hooked.id = store_->AddBackwardNode(NodeName(*fn), forward_node, address, may_begin);
  auto hook = std::make_unique<NodeHook>(store_, hooked.id, fn->num_inputs());
  hooked.hook = hook.get();
  fn->add_pre_hook(std::move(hook));
  return hooked;
}

int32_t GradientHooks::TensorOf(Hooked& hooked, uint32_t input_nr) {
  std::vector<int32_t>& inputs = hooked.hook->inputs();
  if (input_nr >= inputs.size()) inputs.resize(input_nr + 1, -1);
  if (inputs[input_nr] < 0) inputs[input_nr] = store_->AddTensor();
  return inputs[input_nr];
}

void GradientHooks::HookOpNodes(const std::shared_ptr<torch::autograd::Node>& fn, int32_t node) {
  std::vector<std::shared_ptr<torch::autograd::Node>> pending = {fn};
  std::vector<std::shared_ptr<torch::autograd::Node>> made;
  while (!pending.empty()) {
    std::shared_ptr<torch::autograd::Node> next = std::move(pending.back());
    pending.pop_back();
    const uint64_t sequence = next->sequence_nr();
    if (sequence == kUnnumbered || sequence < op_start_) continue;  // not this op's
    auto it = nodes_.find(next.get());
    if (it != nodes_.end() && !it->second.node.expired()) continue;  // seen
    Hook(next, node, std::string(), /*may_begin=*/true);
    for (const torch::autograd::Edge& edge : next->next_edges()) {
      if (edge.function) pending.push_back(edge.function);
    }
    made.push_back(std::move(next));
  }
  // Where each new node's gradient flows: to the nodes hooked so far (earlier ops', the
  // inputs' and parameters' accumulators, and this op's own).
  for (const std::shared_ptr<torch::autograd::Node>& from : made) {
    const int32_t id = nodes_.at(from.get()).id;
    for (const torch::autograd::Edge& edge : from->next_edges()) {
      if (!edge.function) continue;
      auto it = nodes_.find(edge.function.get());
      if (it != nodes_.end() && !it->second.node.expired()) {
        store_->AddBackwardEdge(id, it->second.id);
      }
    }
  }
}

void GradientHooks::OnValue(const CaptureRecord& record, int32_t node, int32_t output,
                            const at::Tensor& value) {
  const bool op = record.nodes[node].kind == NodeRecord::Kind::kOp;
  if (op && node != current_op_) {
    current_op_ = node;
    op_start_ = mark_;
  }
  if (value.defined() && value.requires_grad()) {
    const torch::autograd::Edge edge = torch::autograd::impl::gradient_edge(value);
    if (edge.function) {
      if (op) HookOpNodes(edge.function, node);
      const bool leaf = edge.function->sequence_nr() == kUnnumbered;
      // An input's or constant's own node (its accumulator, or a graph made before the
      // capture) is held while capturing: the ops about to read it must find this one.
      if (!op && leaf) held_.push_back(edge.function);
      Hooked& hooked = Hook(edge.function, node, std::string(), /*may_begin=*/false);
      store_->AddTarget(TensorOf(hooked, edge.input_nr), node, output);
    }
  }
  if (op) mark_ = at::sequence_number::peek();
}

std::shared_ptr<GradientStore> GradientHooks::Finish(const CaptureRecord& record) {
  std::vector<GradientStore::Alias> aliases;
  for (size_t n = 0; n < record.nodes.size(); ++n) {
    const NodeRecord& node = record.nodes[n];
    if (node.kind != NodeRecord::Kind::kBufferVersion) continue;
    if (!node.write_kind.has_value()) {
      for (const InitialBuffer& initial : initial_buffers_) {
        if (initial.buffer != node.buffer) continue;
        store_->AddTarget(initial.tensor, static_cast<int32_t>(n), 0);
        store_->SetForwardNode(initial.backward, static_cast<int32_t>(n));
      }
      continue;
    }
    // A fused write (running statistics) is the kernel's, not its output's value.
    if (*node.write_kind == WriteKind::kFused || node.sources_end <= node.sources_begin) continue;
    const SourceRecord& producer = record.sources[node.sources_begin];
    if (producer.kind != SourceRecord::Kind::kNode || producer.output_index < 0) continue;
    aliases.push_back(
        GradientStore::Alias{static_cast<int32_t>(n), producer.index, producer.output_index});
  }
  store_->AddAliases(aliases);
  held_.clear();
  nodes_.clear();
  return store_;
}

}  // namespace torchlens
