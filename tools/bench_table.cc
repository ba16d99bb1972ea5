#include "tools/bench_table.h"

#include <cstdint>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace torchlens {

void PrintTable(const nlohmann::json& rows) {
  std::cout << absl::StrFormat("%-15s %-21s %12s %8s %10s %7s %12s %10s %8s\n", "model", "config",
                               "median_us", "ratio", "us/op+", "ops", "peak+ MB", "saved MB",
                               "peak+/sv");
  for (const nlohmann::json& row : rows) {
    auto number = [&](const char* key, const char* format) -> std::string {
      return row.contains(key) ? absl::StrFormat(format, row[key].get<double>()) : "";
    };
    std::string ops = absl::StrCat(row["recorded_ops"].get<int64_t>());
    if (row.contains("reexecuted_ops")) ops = absl::StrCat(row["reexecuted_ops"].get<int>(), " re");
    std::cout << absl::StrFormat(
        "%-15s %-21s %12.1f %7.3fx %10s %7s %12s %10s %8s\n", row["model"].get<std::string>(),
        row["config"].get<std::string>(), row["median_us"].get<double>(),
        row["ratio"].get<double>(), number("added_us_per_op", "%.3f"), ops,
        row.contains("peak_above_plain_bytes")
            ? absl::StrFormat("%.2f", row["peak_above_plain_bytes"].get<double>() / 1e6)
            : "",
        row.contains("saved_bytes")
            ? absl::StrFormat("%.2f", row["saved_bytes"].get<double>() / 1e6)
            : "",
        number("peak_above_plain_over_saved", "%.3f"));
  }
  for (const nlohmann::json& row : rows) {
    if (!row.contains("write_MBps")) continue;
    std::cout << absl::StrFormat(
        "%-15s capture_to_disk wrote %.1f MB at %.0f MB/s (the capture's time beyond "
        "capture_unsaved_graph); write loop %.0f MB/s; ratio %.2f; peak resident set above plain "
        "%.1f MB\n",
        row["model"].get<std::string>(), row["saved_bytes"].get<double>() / 1e6,
        row["write_MBps"].get<double>(), row["write_loop_MBps"].get<double>(),
        row["bandwidth_vs_write_loop"].get<double>(),
        row["peak_resident_above_plain_bytes"].get<double>() / 1e6);
  }
}

void PrintGradientVerdicts(const std::string& name, const nlohmann::json& rows) {
  for (const nlohmann::json& row : rows) {
    if (row.contains("passed")) {
      std::cout << name
                << " ValidateGradients: " << (row["passed"].get<bool>() ? "PASSED" : "FAILED")
                << " (" << row["gradients_checked"].get<int>() << " gradients checked)\n";
    }
  }
}

void PrintScalingRow(const nlohmann::json& row) {
  std::cout << absl::StrFormat(
      "scaling %s (per-op cost, median of %d pairs of blocks, frees %s): captured forward "
      "%.3fx, plain forward %.3fx, added by capture %.3fx\n",
      row["model"].get<std::string>(), row["repeats"].get<int>(), row["frees"].get<std::string>(),
      row["capture_per_op_ratio"].get<double>(), row["plain_per_op_ratio"].get<double>(),
      row["added_per_op_ratio"].get<double>());
}

}  // namespace torchlens
