#include "validation/validate.h"

#include <c10/core/impl/LocalDispatchKeySet.h>

#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "torchlens_dispatch/ops/capture_key.h"
#include "validation/op_arguments.h"
#include "validation/op_checks.h"

namespace torchlens {

absl::StatusOr<ValidationReport> ValidateForwardPass(const Trace& trace) {
  return ValidateForwardPass(trace, ValidationOptions());
}

absl::StatusOr<ValidationReport> ValidateForwardPass(const Trace& trace,
                                                     const ValidationOptions& options) {
  if (absl::Status saved = RequireSavedValues(trace, "validate it"); !saved.ok()) return saved;
  if (options.threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("ValidationOptions::threads is ", options.threads, "; give 1 or more"));
  }
  c10::impl::ExcludeDispatchKeyGuard not_captured(kCaptureKey);
  return CheckTrace(trace, static_cast<size_t>(options.threads));
}

std::string ValidationReportToJson(const ValidationReport& report) {
  nlohmann::ordered_json json;
  json["passed"] = report.passed;
  json["ops_checked"] = report.ops_checked;
  json["failures"] = report.failures;
  json["dead"] = report.dead;
  json["state_transition_only"] = report.state_transition_only;
  json["perturbations_checked"] = report.perturbations_checked;
  json["unproved"] = report.unproved;
  json["not_checked"] = report.not_checked;
  json["cut_off"] = report.cut_off;
  // Labels read from a file may not be UTF-8: replaced (U+FFFD), never thrown.
  return json.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace torchlens
