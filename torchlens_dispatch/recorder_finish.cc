// Recorder: the end of a capture (Finish and its steps) and reassignments TorchScript
// code reports as they happen.
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <algorithm>
#include <atomic>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "torchlens_dispatch/ops/capture_key.h"
#include "torchlens_dispatch/ops/ivalue_tensors.h"
#include "torchlens_dispatch/ops/saved_copy.h"
#include "torchlens_dispatch/recorder.h"

namespace torchlens {

void Recorder::OnAttributeAssigned() {
  if (inert_ || finished_ || !journal_.has_assigned_buffers()) return;
  NoCapture no_capture(kCaptureKey);
  try {
    journal_.CheckAssigned();
  } catch (const std::exception& e) {
    Abandon(e);
  }
}

void Recorder::OnBufferAssigned(const void* module, const std::string& name,
                                const at::Tensor& tensor) {
  if (inert_ || finished_) return;
  auto it = layout_->eager_buffer_ids.find(std::make_pair(module, name));
  if (it == layout_->eager_buffer_ids.end()) return;
  NoCapture no_capture(kCaptureKey);
  try {
    journal_.Assign(it->second, tensor);
  } catch (const std::exception& e) {
    Abandon(e);
  }
}

absl::StatusOr<CaptureRecord> Recorder::Finish(const c10::IValue& outputs) {
  NoCapture no_capture(kCaptureKey);
  if (finished_) return absl::FailedPreconditionError("the capture already finished");
  finished_ = true;
  if (!failure_.ok()) return failure_;
  record_.StreamDeferredValues();
  if (!options_.halt_after.empty() && halt_label_.empty() && halt_module_ < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CaptureOptions::halt_after is \"", options_.halt_after,
        "\", which is neither a module address of this model (named_modules() names them) "
        "nor an op label (labels end in ':' and a pass, \"relu_1_2:1\")"));
  }
  for (const std::string& address : options_.save_modules) {
    if (layout_->module_ids.contains(address)) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        "CaptureOptions::save_modules names \"", address,
        "\", which is not a module address of this model (named_modules() names them), so "
        "it would select nothing"));
  }
  if (!halted_ && (!halt_label_.empty() || (halt_module_ >= 0 && !halt_module_entered_))) {
    // The forward ran to the end: a trace presented as the halted one would be a silent
    // surprise (a misspelt pass, an unused submodule).
    return absl::InvalidArgumentError(absl::StrCat(
        "CaptureOptions::halt_after is \"", options_.halt_after, "\", but ",
        halt_label_.empty() ? "that module ran no op" : "no op of this forward had that label",
        ", so the forward ran to the end and was not halted (its buffers hold what it "
        "wrote). Labels are \"{type}_{type index}_{layer step}:{pass}\", as a full "
        "capture's summary lists them"));
  }
  CaptureRecord& record = record_.record();
  if (over_budget_) {
    record.budget_exceeded = true;
    record.partial_reason = absl::StrCat(
        "saving stopped at {label}: the saved values reached CaptureOptions::max_saved_bytes (",
        options_.max_saved_bytes, " bytes; ", saved_bytes_,
        " saved); later ops have metadata only");
  }
  if (!halted_) journal_.CheckAll();
  CopySavedValuesOfModelState();
  AddOutputNodes(outputs);
  if (absl::Status unjournaled = journal_.Finish(options_.allow_unjournaled_writes);
      !unjournaled.ok()) {
    return unjournaled;
  }
  record.stats.marked_sites = script_sites_.marked();
  record.stats.interpreter_sites = script_sites_.asked();
  record.extra_module_addresses = module_addresses_.ReleaseExtra();
  record.num_layers = next_layer_;
  StoreSizes();
  return record_.Release();
}

absl::StatusOr<CaptureRecord> Recorder::FinishAfterForwardError(std::string reason) {
  if (inert_ || finished_) {
    return Finish(c10::IValue());  // the capture's own failure, a halt, or a second call
  }
  failure_ = absl::OkStatus();  // the forward's exception, which reached its caller
  CaptureRecord& record = record_.record();
  record.partial_reason = std::move(reason);
  record.partial_node = static_cast<int32_t>(record.nodes.size()) - 1;
  // The forward may have stopped between a buffer's change and the op that journals it.
  options_.allow_unjournaled_writes = true;
  return Finish(c10::IValue());
}

void Recorder::CopySavedValuesOfModelState(c10::ArrayRef<const c10::StorageImpl*> restored) {
  // Saved values that live in a buffer's storage (views of buffers), or in the storage of
  // a parameter the forward wrote, would change with the model's next write, which no
  // capture sees: copy them now (NOTE [Copy-on-write of saved values]).
  auto model_state = [&](const c10::StorageImpl* storage) {
    return journal_.BuffersIn(storage) != nullptr ||
           std::find(restored.begin(), restored.end(), storage) != restored.end();
  };
  for (auto& [storage, entry] : storages_) {
    if (!entry.written_param && !model_state(storage)) continue;
    if (!streaming_) {  // streamed values need no copy (NOTE [Streaming identity])
      for (const SavedValue& saved : entry.saved) {
        record_.slot(saved.slot) = CopyOfSaved(record_.slot(saved.slot));
      }
      record_.record().stats.copy_on_write_clones += static_cast<int64_t>(entry.saved.size());
    }
    entry.saved.clear();
  }
  // Values not indexed yet (NOTE [Saved values indexed when a write needs them]) are
  // checked in their list: indexing them all here would cost what the list saved. A
  // streaming capture indexes its values as it streams them, so its list is empty.
  size_t kept = 0;
  for (const UnindexedValue& value : unindexed_values_) {
    // A storage that only its saved value holds is no buffer's or parameter's (the model
    // holds those, and a halt's journal the ones it restores): nothing outside the trace
    // writes it, and most op outputs are dead by now. This skips two hash lookups per value
    // (on recurrent100, 10% of what saving adds, counted with callgrind).
    if (record_.slot(value.saved.slot).storage().use_count() == 1) {
      unindexed_values_[kept++] = value;
      continue;
    }
    const auto it = storages_.find(value.storage);
    if ((it == storages_.end() || !it->second.written_param) && !model_state(value.storage)) {
      unindexed_values_[kept++] = value;
      continue;
    }
    record_.slot(value.saved.slot) = CopyOfSaved(record_.slot(value.saved.slot));
    ++record_.record().stats.copy_on_write_clones;
  }
  unindexed_values_.resize(kept);
}

void Recorder::AddOutputNodes(const c10::IValue& outputs) {
  ForEachTensor(outputs, [&](const at::Tensor& tensor) {
    if (!tensor.defined()) return;
    bool touches_buffer = false;
    int32_t owner_module = -1;
    SourceRecord source = Resolve(tensor, &touches_buffer, &owner_module);
    if (source.kind == SourceRecord::Kind::kParam) {
      // A returned parameter gets a source node (NOTE [Constants]).
      const ModelLayout::ParamEntry& param = layout_->params[source.index];
      const int32_t constant = AddConstantNode(param.saved, param.address);
      source = SourceRecord();
      source.kind = SourceRecord::Kind::kNode;
      source.index = constant;
      source.slot = record_.OutputSlot(constant);
    }
    record_.AddOutputNode(source, tensor,
                          source.slot >= 0 ? source.slot : (saves_ ? Save(tensor) : -1));
  });
}

void Recorder::StoreSizes() {
  ModelLayout::CaptureSizes& sizes = layout_->last_capture_sizes;
  constexpr auto kRelaxed = std::memory_order_relaxed;
  sizes.tensors.store(static_cast<uint32_t>(tensors_.size()), kRelaxed);
  sizes.storages.store(static_cast<uint32_t>(storages_.size()), kRelaxed);
  sizes.layers.store(static_cast<uint32_t>(layers_.size()), kRelaxed);
  sizes.layer_classes.store(static_cast<uint32_t>(layer_of_class_.size()), kRelaxed);
  record_.StoreSizes(&sizes);
}

}  // namespace torchlens
