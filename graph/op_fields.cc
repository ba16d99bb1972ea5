#include "graph/op_fields.h"

namespace torchlens {

std::vector<absl::string_view> OpFieldNames(bool saved_values) {
  std::vector<absl::string_view> names;
  const Op op;
  VisitOpFields(op, [&](const char* name, const auto&, OpField field) {
    if (saved_values || !field.saved_value) names.push_back(name);
  });
  return names;
}

}  // namespace torchlens
