// Recorder: the end of a capture (Finish and its steps, an early stop, a failure of the
// capture's own work) and the reassignments the model's code reports as they happen.
#include <ATen/ops/isfinite.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <algorithm>
#include <atomic>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "torchlens_dispatch/ops/capture_key.h"
#include "torchlens_dispatch/ops/exception_text.h"
#include "torchlens_dispatch/ops/ivalue_tensors.h"
#include "torchlens_dispatch/ops/saved_copy.h"
#include "torchlens_dispatch/recorder.h"

namespace torchlens {

void Recorder::OnAttributeAssigned() {
  if (progress_.inert || progress_.finished || !journal_.has_assigned_buffers()) return;
  NoCapture no_capture(kCaptureKey);
  try {
    journal_.CheckAssigned();
  } catch (const std::exception& e) {
    Abandon(e);
  }
}

void Recorder::OnBufferAssigned(const void* module, const std::string& name,
                                const at::Tensor& tensor) {
  if (progress_.inert || progress_.finished) return;
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
  if (progress_.finished) return absl::FailedPreconditionError("the capture already finished");
  progress_.finished = true;
  if (!progress_.failure.ok()) return progress_.failure;
  record_.StreamDeferredValues();
  if (absl::Status checked = policy_.CheckAtEnd(progress_.halted); !checked.ok()) return checked;
  CaptureRecord& record = record_.record();
  if (policy_.over_budget()) {
    record.budget_exceeded = true;
    record.partial_reason = policy_.BudgetReason();
  }
  if (!progress_.halted) journal_.CheckAll();
  CopySavedValuesOfModelState();
  AddOutputNodes(outputs);
  if (absl::Status unjournaled = journal_.Finish(options_.allow_unjournaled_writes);
      !unjournaled.ok()) {
    return unjournaled;
  }
  record.stats.marked_sites = placement_.marked_sites();
  record.stats.interpreter_sites = placement_.interpreter_sites();
  record.extra_module_addresses = placement_.ReleaseExtraAddresses();
  record.num_layers = placement_.num_layers();
  StoreSizes();
  return record_.Release();
}

absl::StatusOr<CaptureRecord> Recorder::FinishAfterForwardError(std::string reason) {
  if (progress_.inert || progress_.finished) {
    return Finish(c10::IValue());  // the capture's own failure, a halt, or a second call
  }
  progress_.failure = absl::OkStatus();  // the forward's exception, which reached its caller
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
  for (auto& [storage, entry] : index_.storages()) {
    if (!entry.written_param && !model_state(storage)) continue;
    if (!policy_.streaming()) {  // streamed values need no copy (NOTE [Streaming identity])
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
  for (const UnindexedValue& value : index_.unindexed()) {
    // A storage that only its saved value holds is no buffer's or parameter's (the model
    // holds those, and a halt's journal the ones it restores): nothing outside the trace
    // writes it, and most op outputs are dead by now. This skips two hash lookups per value.
    if (record_.slot(value.saved.slot).storage().use_count() == 1) {
      index_.unindexed()[kept++] = value;
      continue;
    }
    const auto it = index_.storages().find(value.storage);
    if ((it == index_.storages().end() || !it->second.written_param) &&
        !model_state(value.storage)) {
      index_.unindexed()[kept++] = value;
      continue;
    }
    record_.slot(value.saved.slot) = CopyOfSaved(record_.slot(value.saved.slot));
    ++record_.record().stats.copy_on_write_clones;
  }
  index_.unindexed().resize(kept);
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
                          source.slot >= 0 ? source.slot : (policy_.saves() ? Save(tensor) : -1));
  });
}

void Recorder::StoreSizes() {
  ModelLayout::CaptureSizes& sizes = layout_->last_capture_sizes;
  constexpr auto kRelaxed = std::memory_order_relaxed;
  sizes.tensors.store(static_cast<uint32_t>(tensors_.size()), kRelaxed);
  sizes.storages.store(static_cast<uint32_t>(index_.storages().size()), kRelaxed);
  placement_.StoreSizes(&sizes);
  record_.StoreSizes(&sizes);
}

bool Recorder::ReturnsNonFinite(c10::ArrayRef<c10::IValue> returns) {
  NoCapture no_capture(kCaptureKey);
  bool non_finite = false;
  for (const c10::IValue& value : returns) {
    ForEachTensor(value, [&](const at::Tensor& t) {
      if (non_finite || !t.defined() || t.layout() != at::kStrided || t.numel() == 0 ||
          !(t.is_floating_point() || t.is_complex())) {
        return;
      }
      non_finite = !at::isfinite(t).all().item<bool>();
    });
  }
  return non_finite;
}

void Recorder::Halt(int32_t node, std::string reason) {
  // The forward stops here: the model's buffers and written parameters go back to their
  // values before it, and the capture records nothing more.
  NoCapture no_capture(kCaptureKey);
  progress_.halted = true;
  progress_.inert = true;
  // Saved values that alias a buffer or a written parameter (an in-place op's output is
  // the tensor itself) keep what the forward computed; the restores below would otherwise
  // write them too.
  CopySavedValuesOfModelState(journal_.InitialStorages());
  journal_.RestoreInitialState();
  params_.RestoreWritten();
  CaptureRecord& record = record_.record();
  record.partial_node = node;
  record.partial_reason = std::move(reason);
  throw CaptureHalted(
      "torchlens: the capture halted the forward (CaptureOptions::halt_after "
      "or stop_at_non_finite)");
}

void Recorder::Abandon(const std::exception& e) {
  journal_.DropPendingWrites();
  index_.overwritten().clear();
  index_.DropMovedAliases();
  progress_.inert = true;
  if (!progress_.failure.ok()) return;
  const bool memory = IsOutOfMemory(e);
  const std::string message = absl::StrCat(
      memory ? "out of memory while saving values during capture (" : "capture failed (",
      FirstLine(e),
      "); the forward pass was not affected but the trace is incomplete and was dropped. ",
      memory ? "Free memory, or capture with CaptureOptions::save_activations = false"
             : "Report this with the model that triggers it");
  progress_.failure = memory ? absl::ResourceExhaustedError(message) : absl::InternalError(message);
}

}  // namespace torchlens
