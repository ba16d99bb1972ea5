// Which drawn node each node of a trace becomes, for pictures of big graphs
// (RenderOptions::max_module_depth and RenderOptions::rolled in graph/render.h).
//
// NOTE [Collapsed and rolled pictures]
// With a depth limit N, a module N levels deep ("layer1.0" is 2 levels deep) is drawn as
// one box per call, holding every node of the call: its own ops, its submodules' ops and
// the buffer versions they make (calls are read as NOTE [Module calls] says). The modules
// above it stay clusters. The rolled view draws every pass of a layer as one node (the
// label without ":pass", with the number of passes), and every call of a collapsed module
// as one box with the number of calls, as TorchLens's rolled view does; edges are the union
// of the passes' edges, so a loop draws as a cycle. Inputs and outputs are always their
// own nodes.
#ifndef TORCHLENS_GRAPH_RENDER_GROUPS_H_
#define TORCHLENS_GRAPH_RENDER_GROUPS_H_

#include <string>
#include <vector>

#include "graph/trace.h"

namespace torchlens {

struct RenderGroup {
  enum class Kind {
    kNode,    // one node of the trace
    kLayer,   // the passes of one layer (rolled view)
    kModule,  // a collapsed module: one call, or every call in the rolled view
  };
  Kind kind = Kind::kNode;
  int first = 0;        // the first member, a position in `Trace::ops()`
  std::string name;     // kLayer: the label without ":pass"; kModule: the module address
  int compute_ops = 0;  // members that are compute ops
  int passes = 0;       // kLayer: members; kModule: calls drawn in it
  int call = 0;         // kModule, not rolled: which call of the module (1-based)
};

struct RenderGrouping {
  std::vector<RenderGroup> groups;  // in order of first member
  std::vector<int> group_of;        // for every node of the trace
};

// `max_module_depth` < 1: no module is collapsed.
RenderGrouping GroupForRender(const Trace& trace, int max_module_depth, bool rolled);

// The levels of a module address: 0 for the root "", 1 for "layer1", 2 for "layer1.0".
int ModuleDepth(absl::string_view address);

}  // namespace torchlens

#endif  // TORCHLENS_GRAPH_RENDER_GROUPS_H_
