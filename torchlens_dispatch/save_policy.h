// What a capture keeps and where it stops: selective saving (NOTE [Selective saving] in
// capture_options.h), the memory budget (CaptureOptions::max_saved_bytes) and early stop
// (CaptureOptions::halt_after). Decided once per user-level op, when the recorder has
// placed it (op_placement.h); the policy keeps the labels it computes for that, if any.
//
//   SavePolicy policy(options, *layout, /*saves=*/true);
//   SavePolicy::Decision d = policy.Decide(type, type_id, func_name, place, placement);
#ifndef TORCHLENS_DISPATCH_SAVE_POLICY_H_
#define TORCHLENS_DISPATCH_SAVE_POLICY_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "graph/layer_numbering.h"
#include "torchlens_dispatch/capture_options.h"
#include "torchlens_dispatch/model_layout.h"
#include "torchlens_dispatch/op_placement.h"

namespace torchlens {

class SavePolicy {
 public:
  SavePolicy(const CaptureOptions& options, const ModelLayout& layout);

  // Whether the capture keeps or streams values at all.
  bool saves() const { return saves_; }
  // NOTE [Streaming without saving]: a value sink and no saved values.
  bool streaming() const { return streaming_; }
  // Whether some save_* option selects ops (then unselected ops' arguments are saved by
  // their readers).
  bool selective() const { return selective_; }
  // Whether the forward may be stopped early (halt_after, stop_at_non_finite).
  bool may_halt() const { return may_halt_; }
  // Labels are computed while capturing: the id of an operator type for them, or -1.
  int32_t TypeId(const std::string& type) { return labels_needed_ ? numbering_.TypeId(type) : -1; }

  struct Decision {
    bool save = false;         // keep the op's values
    bool halt_before = false;  // halt_after's module has finished: stop before the op
    bool halt_after = false;   // the op is halt_after's label: stop right after it
  };
  // For the op of `type` (TypeId's `type_id`, operator `func_name`) at `place`.
  Decision Decide(const std::string& type, int32_t type_id, std::string_view func_name,
                  const OpPlacement::Place& place, const OpPlacement& placement);
  // `value` was saved (max_saved_bytes counts its bytes; only then are they asked for,
  // which a sparse tensor cannot answer).
  void CountSaved(const at::Tensor& value) {
    if (max_saved_bytes_ >= 0) saved_bytes_ += static_cast<int64_t>(value.nbytes());
  }
  bool over_budget() const { return over_budget_; }
  // At the end: kInvalidArgument when halt_after or save_modules named nothing of the
  // model, or halt_after never stopped a forward that was not `halted`.
  absl::Status CheckAtEnd(bool halted) const;
  // Why a trace over its budget is partial ("{label}" for the op where saving stopped).
  std::string BudgetReason() const;

 private:
  const CaptureOptions& options_;
  const ModelLayout& layout_;
  const bool streaming_;
  const bool saves_;
  const bool selective_;
  bool may_halt_ = false;
  bool labels_needed_ = false;
  std::string halt_label_;    // halt_after, when it is a label
  int32_t halt_module_ = -1;  // or a module (id), entered once ops ran in it
  bool halt_module_entered_ = false;
  std::vector<int32_t> save_module_ids_;  // save_modules, as module ids
  LayerNumbering numbering_;              // labels while capturing
  const int64_t max_saved_bytes_;
  int64_t saved_bytes_ = 0;
  bool over_budget_ = false;
};

}  // namespace torchlens

#endif  // TORCHLENS_DISPATCH_SAVE_POLICY_H_
