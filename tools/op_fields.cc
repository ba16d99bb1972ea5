// Prints NOTE [One Op field table]: one line per field, "NAME metadata" or "NAME
// saved_value", in file order. tools/check_trace_file.py checks the keys of the ops in a
// trace file and in its JSON against it, so that the Python side follows the table.
#include "graph/op_fields.h"

#include <algorithm>
#include <iostream>
#include <vector>

int main() {
  const std::vector<absl::string_view> metadata = torchlens::OpFieldNames(false);
  for (absl::string_view name : torchlens::OpFieldNames(true)) {
    const bool is_metadata = std::find(metadata.begin(), metadata.end(), name) != metadata.end();
    std::cout << name << (is_metadata ? " metadata" : " saved_value") << "\n";
  }
  return 0;
}
