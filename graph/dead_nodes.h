// Dead computation: nodes whose values nothing the forward pass produced depends on.
//
// A model may compute a value and discard it (torchvision's region proposal network
// returns its kept proposals' scores, which the caller drops). Such a node is part of
// what ran, so the trace keeps it, but no model output, buffer write, or op whose result
// leaves the graph as a non-tensor (`item`, a condition) is downstream of it. Validation
// lists these nodes (ValidationReport::dead) instead of failing them, and rendering can
// hide them (RenderOptions::show_dead).
#ifndef TORCHLENS_GRAPH_DEAD_NODES_H_
#define TORCHLENS_GRAPH_DEAD_NODES_H_

#include <vector>

#include "graph/trace.h"

namespace torchlens {

// Positions in `trace.ops()` of the dead nodes, in execution order. Inputs are never dead.
std::vector<int> DeadNodes(const Trace& trace);

}  // namespace torchlens

#endif  // TORCHLENS_GRAPH_DEAD_NODES_H_
