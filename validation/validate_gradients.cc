// ValidateGradients (validate.h): each saved gradient against the backward of the ops that
// read its value, re-run from their saved arguments and their outputs' saved gradients.
//
// NOTE [Checking a gradient]
// The gradient of a value is the sum of what the backward of each op that read it gave it.
// So every op with saved arguments and a saved gradient on some output is re-run (replay.h)
// with autograd on, from leaves made of its saved arguments (one leaf per value, as one
// value read twice by an op gets both contributions inside its backward), and
// autograd::grad takes its outputs' saved gradients back to the leaves. A written argument
// is passed as a clone of its leaf, whose backward is the identity. Then each value's
// contributions are summed in the order autograd accumulated them: the execution order of
// the backward ops (Trace::backward_ops) that fed the value's node, as autograd adds each
// incoming gradient to what arrived before. The sum must equal the saved gradient bit for
// bit; a sum of several contributions that is equal only up to rounding (a reader whose
// contributions arrived at two moments, between others) is unproved, never failed. A value
// read outside the trace (a model output, which the loss read) gets part of its gradient
// from outside: it is not checked. Parameters are read as they are now, as in forward
// validation: validate before an optimizer step.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <climits>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "torchlens_dispatch/ops/bit_identical.h"
#include "torchlens_dispatch/ops/capture_key.h"
#include "torchlens_dispatch/ops/exception_text.h"
#include "torchlens_dispatch/ops/ivalue_tensors.h"
#include "validation/replay.h"
#include "validation/validate.h"

namespace torchlens {
namespace {

// A value whose gradient the trace holds: output `output` of node `node` (labelled `name`),
// or the parameter at `name`.
struct Key {
  std::string name;
  int32_t node = -1;
  int output = 0;
  bool param = false;
  bool operator<(const Key& other) const {
    return std::tie(param, node, name, output) <
           std::tie(other.param, other.node, other.name, other.output);
  }
};

std::string Describe(const Key& key) {
  if (key.param) return absl::StrCat("parameter ", key.name);
  return key.output == 0 ? key.name : absl::StrCat(key.name, " (output ", key.output, ")");
}

const at::Tensor& GradOf(const Op& op, int output) {
  static const at::Tensor* const kNone = new at::Tensor();
  if (output < 0) return *kNone;
  if (static_cast<size_t>(output) < op.grads.size()) return op.grads[output];
  return output == 0 ? op.grad : *kNone;
}

struct Contribution {
  int64_t time;     // when autograd added it (see NOTE [Checking a gradient])
  int reader;       // the reader's position in ops(), to order contributions of equal time
  at::Tensor grad;  // what the reader's backward gave the value
};

class GradientValidator {
 public:
  explicit GradientValidator(const Trace& trace) : trace_(trace) {
    const std::vector<const Op*> backward = trace.backward_ops();
    absl::flat_hash_map<std::string, const Op*> by_label;
    for (const Op* op : backward) by_label.emplace(op->label, op);
    for (size_t i = 0; i < backward.size(); ++i) {
      const Op& op = *backward[i];
      if (op.forward_label.empty() || !op.address.empty()) continue;  // not a param's
      int64_t& first =
          first_run_.try_emplace(op.forward_label, static_cast<int64_t>(i)).first->second;
      first = std::min<int64_t>(first, static_cast<int64_t>(i));
      for (const std::string& child : op.children) {
        auto it = by_label.find(child);
        if (it == by_label.end()) continue;
        const Op& fed = *it->second;
        const std::string target =
            fed.address.empty() ? fed.forward_label : absl::StrCat("param:", fed.address);
        fed_at_.try_emplace(std::make_pair(op.forward_label, target), static_cast<int64_t>(i));
      }
    }
  }

  ValidationReport Run() {
    // Values read outside the trace: the outputs'.
    for (const Op& op : trace_.ops()) {
      if (!op.is_output() || op.arg_sources.empty()) continue;
      const ArgSource& source = op.arg_sources[0];
      if (source.kind == ArgSource::Kind::kNode) {
        read_outside_.insert(Canonical(Key{source.name, source.node, source.output_index}));
      }
    }
    for (size_t i = 0; i < trace_.ops().size(); ++i) Rerun(static_cast<int>(i));
    for (auto& [key, contributions] : contributions_) Check(key, &contributions);
    for (const Key& key : read_outside_) {
      if (SavedGrad(key).defined()) report_.not_checked.push_back(Describe(key));
    }
    report_.passed = report_.failures.empty();
    return std::move(report_);
  }

 private:
  // The value a node holds, followed through output nodes and buffer versions to the op
  // output that made it.
  Key Canonical(Key key) const {
    for (int hops = 0; !key.param && hops < 64; ++hops) {
      if (key.node < 0) break;
      const Op& op = trace_.ops()[key.node];
      const bool follows =
          op.is_output() || (op.is_buffer_version() && op.buffer_write_kind.has_value() &&
                             *op.buffer_write_kind != WriteKind::kFused);
      if (!follows || op.arg_sources.empty()) break;
      const ArgSource& source = op.arg_sources[0];
      if (source.kind != ArgSource::Kind::kNode || source.output_index < 0) break;
      key = Key{source.name, source.node, source.output_index};
    }
    return key;
  }

  const at::Tensor& SavedGrad(const Key& key) const {
    static const at::Tensor* const kNone = new at::Tensor();
    if (key.param) {
      auto it = trace_.param_grads().find(key.name);
      return it == trace_.param_grads().end() ? *kNone : it->second;
    }
    return key.node < 0 ? *kNone : GradOf(trace_.ops()[key.node], key.output);
  }

  // When reader `reader`'s backward gave `key` its contribution.
  int64_t TimeOf(const Op& reader, const Key& key) const {
    const std::string target = key.param ? absl::StrCat("param:", key.name) : key.name;
    if (auto it = fed_at_.find(std::make_pair(reader.label, target)); it != fed_at_.end()) {
      return it->second;
    }
    auto it = first_run_.find(reader.label);
    return it == first_run_.end() ? INT64_MAX : it->second;
  }

  // Op `index`'s backward from its saved arguments and outputs' gradients.
  void Rerun(int index) {
    const Op& op = trace_.ops()[index];
    if (!op.is_compute()) return;
    bool has_grad = false;
    for (size_t k = 0; k < std::max<size_t>(op.grads.size(), 1); ++k) {
      has_grad = has_grad || GradOf(op, static_cast<int>(k)).defined();
    }
    if (!has_grad) return;
    if (op.creation_args.empty()) {
      report_.not_checked.push_back(op.label);
      return;
    }
    const std::vector<bool> written = WrittenTensors(op);
    std::map<Key, at::Tensor> leaves;
    std::vector<c10::IValue> args =
        ReplayArguments(op, [&](int tensor, const ArgSource& source, const at::Tensor& saved) {
          if (!saved.defined() || !(saved.is_floating_point() || saved.is_complex())) return saved;
          Key key;
          if (source.kind == ArgSource::Kind::kNode) {
            key = Canonical(Key{source.name, source.node, source.output_index});
          } else if (source.kind == ArgSource::Kind::kParam) {
            key = Key{source.name, -1, 0, /*param=*/true};
          } else {
            return saved;
          }
          if (!SavedGrad(key).defined()) return saved;
          auto [it, made] = leaves.try_emplace(key);
          if (made) it->second = saved.detach().requires_grad_(true);
          const bool writes = static_cast<size_t>(tensor) < written.size() && written[tensor];
          return writes ? it->second.clone() : it->second;
        });
    if (leaves.empty()) return;
    absl::StatusOr<ReplayResult> replay = ReplayOp(op, std::move(args));
    if (!replay.ok()) {
      report_.failures.push_back(absl::StrCat(
          op.label, ": its backward could not be re-run: ", replay.status().message()));
      return;
    }
    std::vector<at::Tensor> outputs, grads;
    for (size_t k = 0; k < replay->outputs.size(); ++k) {
      const at::Tensor& grad = GradOf(op, static_cast<int>(k));
      if (!grad.defined() || !replay->outputs[k].defined() || !replay->outputs[k].requires_grad()) {
        continue;
      }
      outputs.push_back(replay->outputs[k]);
      grads.push_back(grad);
    }
    if (outputs.empty()) return;
    std::vector<Key> keys;
    std::vector<at::Tensor> inputs;
    for (const auto& [key, leaf] : leaves) {
      keys.push_back(key);
      inputs.push_back(leaf);
    }
    std::vector<at::Tensor> given;
    try {
      given = torch::autograd::grad(outputs, inputs, grads, /*retain_graph=*/false,
                                    /*create_graph=*/false, /*allow_unused=*/true);
    } catch (const std::exception& e) {
      report_.failures.push_back(
          absl::StrCat(op.label, ": its backward from the saved gradients threw: ", FirstLine(e)));
      return;
    }
    for (size_t i = 0; i < keys.size(); ++i) {
      if (!given[i].defined()) continue;
      contributions_[keys[i]].push_back(Contribution{TimeOf(op, keys[i]), index, given[i]});
    }
  }

  // By tensor index (ForEachTensor order), whether the op's schema declares it written.
  static std::vector<bool> WrittenTensors(const Op& op) {
    std::vector<bool> written;
    c10::optional<c10::OperatorHandle> handle =
        c10::Dispatcher::singleton().findSchema({op.func_name, op.overload_name});
    if (!handle.has_value()) return written;
    const std::vector<c10::Argument>& arguments = handle->schema().arguments();
    for (size_t a = 0; a < op.creation_args.size(); ++a) {
      const bool writes = a < arguments.size() && arguments[a].alias_info() != nullptr &&
                          arguments[a].alias_info()->isWrite();
      ForEachTensor(op.creation_args[a], [&](const at::Tensor&) { written.push_back(writes); });
    }
    return written;
  }

  void Check(const Key& key, std::vector<Contribution>* contributions) {
    if (read_outside_.count(key) > 0) return;  // not checked
    const at::Tensor& saved = SavedGrad(key);
    std::stable_sort(contributions->begin(), contributions->end(),
                     [](const Contribution& a, const Contribution& b) {
                       return std::tie(a.time, b.reader) < std::tie(b.time, a.reader);
                     });
    at::Tensor sum;
    for (const Contribution& contribution : *contributions) {
      sum = sum.defined() ? sum + contribution.grad : contribution.grad;
    }
    ++report_.ops_checked;
    if (BitIdentical(saved, sum)) return;
    if (saved.sizes() != sum.sizes()) {
      report_.failures.push_back(absl::StrCat(
          Describe(key), ": its saved gradient has shape [", absl::StrJoin(saved.sizes(), ", "),
          "], its readers' backward gives [", absl::StrJoin(sum.sizes(), ", "), "]"));
      return;
    }
    const double difference =
        (saved.to(at::kDouble) - sum.to(at::kDouble)).abs().max().item<double>();
    const bool rounding = contributions->size() > 1 &&
                          at::allclose(saved.to(at::kDouble), sum.to(at::kDouble), 1e-5, 1e-7);
    if (rounding) {
      report_.unproved.push_back(absl::StrFormat(
          "%s: its %d readers' contributions sum to its saved gradient only up to rounding (max "
          "abs diff %g): they arrived in another order than the backward ops say",
          Describe(key), contributions->size(), difference));
      return;
    }
    report_.failures.push_back(absl::StrFormat(
        "%s: its saved gradient is not what the backward of its %d reader%s gives from their "
        "saved values and gradients (max abs diff %g)",
        Describe(key), contributions->size(), contributions->size() == 1 ? "" : "s", difference));
  }

  const Trace& trace_;
  ValidationReport report_;
  // Backward ops: (forward label, fed value) -> when the first such op ran, and each forward
  // label's first backward op.
  absl::flat_hash_map<std::pair<std::string, std::string>, int64_t> fed_at_;
  absl::flat_hash_map<std::string, int64_t> first_run_;
  std::map<Key, std::vector<Contribution>> contributions_;
  std::set<Key> read_outside_;
};

}  // namespace

absl::StatusOr<ValidationReport> ValidateGradients(const Trace& trace) {
  if (absl::Status saved = RequireSavedValues(trace, "validate its gradients"); !saved.ok()) {
    return saved;
  }
  if (!trace.records_gradients()) {
    return absl::FailedPreconditionError(
        "the trace holds no gradients: capture with CaptureOptions::save_grads = true "
        "(save_grads=True in Python, --backward for the command-line tool), then run "
        "backward() from its outputs before validating the gradients");
  }
  c10::impl::ExcludeDispatchKeyGuard not_captured(kCaptureKey);
  c10::InferenceMode not_inference(false);
  c10::AutoGradMode with_grad(true);
  return GradientValidator(trace).Run();
}

}  // namespace torchlens
