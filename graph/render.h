// Drawing a trace: Graphviz DOT text, and SVG / PNG / PDF through Graphviz's C library.
//
//   std::string dot = torchlens::RenderDot(*trace);   // ShowBuffers::kMeaningful
//   absl::Status s = torchlens::RenderToFile(*trace, "graph.svg");
//
// One node per op (label, type, output shape, module; parameters it read summarised on
// it), inputs and outputs marked, modules drawn as nested clusters by address (a module
// that would frame a single node and no submodule is not framed: its node names it). Buffer
// version nodes are `shape=cylinder`, labelled `address:version` with their write kind.
// `ShowBuffers::kMeaningful` (the default) hides BatchNorm/InstanceNorm bookkeeping
// (`running_mean`, `running_var`, `num_batches_tracked`) and the ops that only update it
// (training's `num_batches_tracked.add_(1)`), `kAlways` shows every buffer, `kNever` hides
// all. An op that reads hidden buffer versions gets `peripheries=2` and a
// tooltip "Hidden buffers: ..."; a hidden version written by one op and read by another
// becomes a dashed edge between them, so the data flow stays visible. Constants (tensor
// attributes and other tensors from outside the capture, graph/trace.h) are grey notes.
// Dead computation (graph/dead_nodes.h) is drawn dotted, or not at all with
// `show_dead = false`. A trace with gradients draws its backward ops beside the forward
// (`show_backward`).
#ifndef TORCHLENS_GRAPH_RENDER_H_
#define TORCHLENS_GRAPH_RENDER_H_

#include <string>

#include "absl/status/status.h"
#include "graph/trace.h"

namespace torchlens {

enum class ShowBuffers { kNever, kMeaningful, kAlways };

struct RenderOptions {
  ShowBuffers show_buffers = ShowBuffers::kMeaningful;
  bool show_dead = true;  // draw nodes nothing the forward produced depends on
  // Pictures of big graphs (NOTE [Collapsed and rolled pictures] in graph/render_groups.h).
  // N >= 1: a module N levels deep ("layer1.0" is 2) is one box per call, labelled with
  // its op count; the modules above it stay clusters. 0: every module drawn open.
  int max_module_depth = 0;
  // Draw the passes of each layer once (labelled with their count), and each collapsed
  // module's calls as one box.
  bool rolled = false;
  // Also label ops with the `if` branches inside installed libraries' code (PyTorch's
  // functional.py, BatchNorm's forward); by default only the model's own (LibraryFile in
  // graph/summary.h).
  bool library_branches = false;
  // Draw the backward ops of the latest backward (CaptureOptions::save_grads) beside the
  // forward, in a purple frame: gradient flow between them, and a dotted line from each to
  // the forward node it differentiates.
  bool show_backward = true;
};

std::string RenderDot(const Trace& trace, RenderOptions options = {});

// Lays out the DOT graph with Graphviz (in process) and writes `path`, whose extension
// (.svg, .png, .pdf) picks the format. kInvalidArgument for another extension; kInternal
// when Graphviz fails; a failed write is a status (WriteFileBytes: kResourceExhausted for
// a full disk, kPermissionDenied, kNotFound), never the end of the process.
absl::Status RenderToFile(const Trace& trace, const std::string& path, RenderOptions options = {});

// Whether `op` is a buffer version shown under `show`.
bool BufferShown(const Op& op, ShowBuffers show);

}  // namespace torchlens

#endif  // TORCHLENS_GRAPH_RENDER_H_
