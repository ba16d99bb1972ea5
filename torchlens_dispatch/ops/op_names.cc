#include "torchlens_dispatch/ops/op_names.h"

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"

namespace torchlens {

std::string OpTypeName(const c10::OperatorName& name) {
  absl::string_view base = name.name;
  if (const size_t colons = base.rfind("::"); colons != absl::string_view::npos) {
    base = base.substr(colons + 2);
  }
  if (base.size() > 4 && absl::StartsWith(base, "__") && absl::EndsWith(base, "__")) {
    base = base.substr(2, base.size() - 4);
  }
  return std::string(base);
}

}  // namespace torchlens
