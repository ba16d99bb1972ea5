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
// None in a trace whose forward was halted (HaltedForward): what its later ops would have
// read is unknown.
std::vector<int> DeadNodes(const Trace& trace);

// Whether the trace's forward was halted before its end (CaptureOptions::halt_after,
// stop_at_non_finite: the partial reason the capture gives begins "the forward was
// halted"). A trace whose saving stopped at the memory budget ran its whole forward.
bool HaltedForward(const Trace& trace);

// In a halted trace, the positions of the nodes that nothing recorded reads (as DeadNodes
// finds them in a complete one): the halt cut off their readers, so they are not dead
// computation. Empty for a trace that ran to its end.
std::vector<int> CutOffNodes(const Trace& trace);

}  // namespace torchlens

#endif  // TORCHLENS_GRAPH_DEAD_NODES_H_
