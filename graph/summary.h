// A readable text summary of a trace: its ops (label, type, output shape, module,
// parents), parameters and buffers (versions and how each was written).
//
//   std::cout << torchlens::FormatSummary(*trace);
#ifndef TORCHLENS_GRAPH_SUMMARY_H_
#define TORCHLENS_GRAPH_SUMMARY_H_

#include <string>

#include "graph/trace.h"

namespace torchlens {

std::string FormatSummary(const Trace& trace);

// "[1, 3, 224, 224]"; "[]" for a scalar.
std::string FormatShape(c10::IntArrayRef shape);

}  // namespace torchlens

#endif  // TORCHLENS_GRAPH_SUMMARY_H_
