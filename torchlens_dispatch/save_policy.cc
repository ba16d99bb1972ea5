#include "torchlens_dispatch/save_policy.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "graph/label.h"

namespace torchlens {

SavePolicy::SavePolicy(const CaptureOptions& options, const ModelLayout& layout)
    : options_(options),
      layout_(layout),
      streaming_(!options.save_activations && options.value_sink != nullptr),
      saves_(options.save_activations || streaming_),
      selective_(options.save_activations &&
                 (!options.save_modules.empty() || !options.save_types.empty() ||
                  !options.save_labels.empty() || options.save_if != nullptr)),
      max_saved_bytes_(options.max_saved_bytes) {
  if (options.halt_after.find(':') != std::string::npos) {
    halt_label_ = options.halt_after;
  } else if (!options.halt_after.empty()) {
    auto it = layout.module_ids.find(options.halt_after);
    if (it != layout.module_ids.end()) halt_module_ = it->second;
  }
  for (const std::string& address : options.save_modules) {
    auto it = layout.module_ids.find(address);
    if (it != layout.module_ids.end()) save_module_ids_.push_back(it->second);
  }
  may_halt_ = !options.halt_after.empty() || options.stop_at_non_finite;
  labels_needed_ = !halt_label_.empty() ||
                   (selective_ && (!options.save_labels.empty() || options.save_if != nullptr));
}

SavePolicy::Decision SavePolicy::Decide(const std::string& type, int32_t type_id,
                                        std::string_view func_name, const OpPlacement::Place& place,
                                        const OpPlacement& placement) {
  Decision decision;
  decision.save = saves_ && !over_budget_;
  if (max_saved_bytes_ >= 0 && saved_bytes_ > max_saved_bytes_ && decision.save) {
    over_budget_ = true;  // NOTE [Selective saving]: from here on, metadata only
    decision.save = false;
  }
  if (halt_module_ >= 0) {
    const bool inside =
        place.module == halt_module_ || placement.IsWithin(place.module, halt_module_);
    if (inside) halt_module_entered_ = true;
    decision.halt_before = !inside && halt_module_entered_;
  }
  if (!labels_needed_ && !selective_) return decision;
  std::string label;
  if (labels_needed_) {
    const LayerNumbering::Numbers numbers = numbering_.Next(place.layer, type_id);
    label = LayerPassLabel(type, numbers.type_index, numbers.step_index, numbers.pass);
    decision.halt_after = label == halt_label_;
  }
  if (!selective_ || !decision.save) return decision;
  // See NOTE [Selective saving].
  auto within = [&](int32_t id) {
    return place.module == id || placement.IsWithin(place.module, id);
  };
  decision.save =
      std::any_of(save_module_ids_.begin(), save_module_ids_.end(), within) ||
      std::find(options_.save_types.begin(), options_.save_types.end(), type) !=
          options_.save_types.end() ||
      std::find(options_.save_labels.begin(), options_.save_labels.end(), label) !=
          options_.save_labels.end() ||
      (options_.save_if != nullptr &&
       options_.save_if(OpQuery{label, type, placement.Address(place.module), func_name}));
  return decision;
}

absl::Status SavePolicy::CheckAtEnd(bool halted) const {
  if (!options_.halt_after.empty() && halt_label_.empty() && halt_module_ < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CaptureOptions::halt_after is \"", options_.halt_after,
        "\", which is neither a module address of this model (named_modules() names them) "
        "nor an op label (labels end in ':' and a pass, \"relu_1_2:1\")"));
  }
  for (const std::string& address : options_.save_modules) {
    if (layout_.module_ids.contains(address)) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        "CaptureOptions::save_modules names \"", address,
        "\", which is not a module address of this model (named_modules() names them), so "
        "it would select nothing"));
  }
  if (!halted && (!halt_label_.empty() || (halt_module_ >= 0 && !halt_module_entered_))) {
    // The forward ran to the end: a trace presented as the halted one would be a silent
    // surprise (a misspelt pass, an unused submodule).
    return absl::InvalidArgumentError(absl::StrCat(
        "CaptureOptions::halt_after is \"", options_.halt_after, "\", but ",
        halt_label_.empty() ? "that module ran no op" : "no op of this forward had that label",
        ", so the forward ran to the end and was not halted (its buffers hold what it "
        "wrote). Labels are \"{type}_{type index}_{layer step}:{pass}\", as a full "
        "capture's summary lists them"));
  }
  return absl::OkStatus();
}

std::string SavePolicy::BudgetReason() const {
  return absl::StrCat(
      "saving stopped at {label}: the saved values reached CaptureOptions::max_saved_bytes (",
      max_saved_bytes_, " bytes; ", saved_bytes_, " saved); later ops have metadata only");
}

}  // namespace torchlens
