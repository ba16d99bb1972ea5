// A readable text summary of a trace: its ops (label, type, output shape, module,
// parents), parameters and buffers (versions and how each was written). Buffer versions
// are named by address and version ("calls:2", "bn.running_mean:1"), as pictures and
// TorchLens name them; Trace::Find takes those and their labels ("buffer_1:2") alike.
//
//   std::cout << torchlens::FormatSummary(*trace);
#ifndef TORCHLENS_GRAPH_SUMMARY_H_
#define TORCHLENS_GRAPH_SUMMARY_H_

#include <string>

#include "absl/strings/string_view.h"
#include "graph/trace.h"

namespace torchlens {

// `library_branches`: also the `if` branches inside installed libraries' code (PyTorch's
// functional.py), which the source column leaves out by default (LibraryFile).
std::string FormatSummary(const Trace& trace, bool library_branches = false);

// Whether a source file is an installed library's (PyTorch's own Python code, anything
// under a site-packages or dist-packages folder) rather than the model's.
bool LibraryFile(absl::string_view file);

// The name the summary gives a node: "ADDRESS:VERSION" for a buffer version, the label
// otherwise.
std::string NodeName(const Op& op);

// "[1, 3, 224, 224]"; "[]" for a scalar.
std::string FormatShape(c10::IntArrayRef shape);

}  // namespace torchlens

#endif  // TORCHLENS_GRAPH_SUMMARY_H_
