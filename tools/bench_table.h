// The bench's printed tables; the JSON rows they print are the bench's --json output.
#ifndef TORCHLENS_TOOLS_BENCH_TABLE_H_
#define TORCHLENS_TOOLS_BENCH_TABLE_H_

#include <nlohmann/json.hpp>
#include <string>

namespace torchlens {

// One line per row (BenchForward's or BenchBackward's), then one per capture to disk.
void PrintTable(const nlohmann::json& rows);

// The verdicts of BenchBackward's validate_grads rows of model `name`.
void PrintGradientVerdicts(const std::string& name, const nlohmann::json& rows);

// One line for a ScalingPair row.
void PrintScalingRow(const nlohmann::json& row);

}  // namespace torchlens

#endif  // TORCHLENS_TOOLS_BENCH_TABLE_H_
