#include "graph/gradients.h"

#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace torchlens {

int32_t GradientStore::AddTensor() {
  std::lock_guard<std::mutex> lock(mu_);
  tensors_.emplace_back();
  return static_cast<int32_t>(tensors_.size()) - 1;
}

void GradientStore::AddTarget(int32_t tensor, int32_t node, int32_t output) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Target>& targets = tensors_[tensor].targets;
  for (const Target& target : targets) {
    if (target.node == node && target.output == output) return;
  }
  targets.push_back(Target{node, output});
}

void GradientStore::SetParam(int32_t tensor, std::string address) {
  std::lock_guard<std::mutex> lock(mu_);
  tensors_[tensor].param = std::move(address);
}

int32_t GradientStore::AddBackwardNode(std::string name, int32_t forward_node, std::string address,
                                       bool may_begin) {
  std::lock_guard<std::mutex> lock(mu_);
  BackwardNode& node = nodes_.emplace_back();
  node.name = std::move(name);
  node.forward_node = forward_node;
  node.address = std::move(address);
  node.may_begin = may_begin;
  return static_cast<int32_t>(nodes_.size()) - 1;
}

void GradientStore::AddBackwardEdge(int32_t from, int32_t to) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int32_t>& next = nodes_[from].next;
  for (int32_t existing : next) {
    if (existing == to) return;
  }
  next.push_back(to);
}

void GradientStore::SetForwardNode(int32_t backward_node, int32_t forward_node) {
  std::lock_guard<std::mutex> lock(mu_);
  nodes_[backward_node].forward_node = forward_node;
}

void GradientStore::AddAliases(const std::vector<Alias>& aliases) {
  if (aliases.empty()) return;
  absl::flat_hash_map<std::pair<int32_t, int32_t>, int32_t> tensor_of;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t t = 0; t < tensors_.size(); ++t) {
      for (const Target& target : tensors_[t].targets) {
        tensor_of.emplace(std::make_pair(target.node, target.output), static_cast<int32_t>(t));
      }
    }
  }
  for (const Alias& alias : aliases) {
    auto it = tensor_of.find(std::make_pair(alias.of, alias.of_output));
    if (it != tensor_of.end()) AddTarget(it->second, alias.node, 0);
  }
}

bool GradientStore::OnNode(int32_t node, const void* task, const std::vector<at::Tensor>& grads,
                           const std::vector<int32_t>& inputs) {
  std::lock_guard<std::mutex> lock(mu_);
  if (detached_) return false;
  BackwardNode& backward = nodes_[node];
  bool began = false;
  if (!running_ || task != task_) {
    // See NOTE [Gradients in a trace]: only the forward's own nodes begin a call.
    if (!backward.may_begin) return false;
    BeginLocked(task);
    began = true;
  }
  backward.ran = static_cast<int32_t>(executed_.size());
  executed_.push_back(node);
  for (const at::Tensor& grad : grads) {
    if (!grad.defined()) continue;
    backward.shape.assign(grad.sizes().begin(), grad.sizes().end());
    backward.dtype = grad.scalar_type();
    break;
  }
  for (size_t k = 0; k < inputs.size() && k < grads.size(); ++k) {
    if (inputs[k] < 0 || !grads[k].defined()) continue;
    Tensor& tensor = tensors_[inputs[k]];
    tensor.grad = grads[k];
    ApplyLocked(tensor);
  }
  return began;
}

void GradientStore::End(const void* task) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!running_ || task != task_) return;
  running_ = false;
  task_ = nullptr;
  if (ops_ != nullptr) BuildBackwardOpsLocked();
}

void GradientStore::BeginLocked(const void* task) {
  running_ = true;
  ran_once_ = true;
  task_ = task;
  for (int32_t node : executed_) nodes_[node].ran = -1;
  executed_.clear();
  for (Tensor& tensor : tensors_) {
    if (!tensor.grad.defined()) continue;
    tensor.grad = at::Tensor();
    ApplyLocked(tensor);
  }
  if (backward_ops_ != nullptr) backward_ops_->clear();
}

void GradientStore::ApplyLocked(const Tensor& tensor) {
  if (!tensor.param.empty() && param_grads_ != nullptr) {
    if (tensor.grad.defined()) {
      (*param_grads_)[tensor.param] = tensor.grad;
    } else {
      param_grads_->erase(tensor.param);
    }
  }
  if (ops_ == nullptr) return;
  for (const Target& target : tensor.targets) {
    if (target.node < 0 || static_cast<size_t>(target.node) >= ops_->size()) continue;
    Op& op = (*ops_)[target.node];
    const size_t output = static_cast<size_t>(target.output);
    if (op.grads.size() <= output) op.grads.resize(output + 1);
    op.grads[output] = tensor.grad;
    if (output == 0) op.grad = tensor.grad;
    while (!op.grads.empty() && !op.grads.back().defined()) op.grads.pop_back();
  }
}

void GradientStore::BuildBackwardOpsLocked() {
  std::vector<Op>& built = *backward_ops_;
  built.clear();
  built.reserve(executed_.size());
  absl::flat_hash_map<std::string, int> counts;
  for (int32_t id : executed_) {
    const BackwardNode& node = nodes_[id];
    Op& op = built.emplace_back();
    op.kind = OpKind::kBackward;
    op.type = node.name;
    op.label = absl::StrCat(node.name, "_", ++counts[node.name]);
    if (node.forward_node >= 0 && static_cast<size_t>(node.forward_node) < ops_->size()) {
      const Op& forward = (*ops_)[node.forward_node];
      op.forward_label = forward.label;
      op.module_address = forward.module_address;
    } else {
      op.address = node.address;
      const size_t dot = node.address.rfind('.');
      op.module_address = dot == std::string::npos ? std::string() : node.address.substr(0, dot);
    }
    op.tensor_shape.assign(node.shape.begin(), node.shape.end());
    if (node.dtype != c10::ScalarType::Undefined) op.tensor_dtype = c10::toString(node.dtype);
  }
  // Gradient flows from a node into those it feeds: each node's parents are the nodes
  // that fed it, in execution order.
  for (int32_t id : executed_) {
    const BackwardNode& node = nodes_[id];
    Op& from = built[node.ran];
    for (int32_t next : node.next) {
      const int32_t to = nodes_[next].ran;
      if (to < 0) continue;
      from.children.push_back(built[to].label);
      from.child_indices.push_back(to);
      built[to].parents.push_back(from.label);
      built[to].parent_indices.push_back(node.ran);
    }
  }
  // A parameter's accumulation differentiates no node of its own: it is linked to the op
  // that read the parameter, whose backward fed it first.
  for (Op& op : built) {
    if (op.forward_label.empty() && !op.parent_indices.empty()) {
      op.forward_label = built[op.parent_indices[0]].forward_label;
    }
  }
}

void GradientStore::Attach(std::vector<Op>* ops, std::vector<Op>* backward_ops,
                           std::map<std::string, at::Tensor>* param_grads) {
  std::lock_guard<std::mutex> lock(mu_);
  ops_ = ops;
  backward_ops_ = backward_ops;
  param_grads_ = param_grads;
  for (const Tensor& tensor : tensors_) {
    if (tensor.grad.defined()) ApplyLocked(tensor);
  }
  if (ran_once_) BuildBackwardOpsLocked();
}

void GradientStore::Detach(const std::vector<Op>* ops) {
  std::lock_guard<std::mutex> lock(mu_);
  if (ops_ != nullptr && ops_ != ops) return;
  ops_ = nullptr;
  backward_ops_ = nullptr;
  param_grads_ = nullptr;
  detached_ = true;
  for (Tensor& tensor : tensors_) tensor.grad = at::Tensor();  // the hooks may outlive it
}

}  // namespace torchlens
