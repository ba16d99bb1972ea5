// Source positions of TorchScript code (`SourcePosition` in graph/trace.h), read from the
// source ranges LibTorch keeps on every graph node.
//
// NOTE [Source positions]
// A loaded TorchScript module runs code LibTorch recompiled from its archive
// ("code/__torch__/....py"); the archive's debug information maps each range of that code
// back to the Python source the model was scripted from (`findSourceRangeThatGenerated`).
// A position is built once per site of a private plan (NOTE [Site markers]) and shared by
// the ops of every capture that run there, so a capture builds no string per op. The plan
// owns its sites' positions together, and a capture keeps a reference to that one owner,
// not one per position: a position's own reference count sits on a line the forward has
// evicted, and counting on it once while recording and once while building the trace
// would be two cache misses per layer. The
// trace's ops then hold aliasing references to one block that keeps the capture's owners.
// The `if`s around a site are read off the graph: a node in block 0 of a `prim::If` ran in
// its `then` body, in block 1 in its `else` body. Ops the interpreter locates (no marker)
// get their statement but no branches: the interpreter's call stack does not say which
// blocks it is in.
#ifndef TORCHLENS_DISPATCH_SOURCE_POSITIONS_H_
#define TORCHLENS_DISPATCH_SOURCE_POSITIONS_H_

#include <torch/csrc/jit/frontend/source_range.h>
#include <torch/csrc/jit/ir/ir.h>

#include <memory>

#include "graph/trace.h"

namespace torchlens {

// The position of `range` in the model's Python source when the debug information has it,
// else in the code LibTorch compiled; null when the range has no source.
std::shared_ptr<const SourcePosition> SourcePositionOf(const torch::jit::SourceRange& range);

// The position of a graph node, with the `if` branches it lies in (outermost first).
std::shared_ptr<const SourcePosition> SourcePositionOfNode(const torch::jit::Node* node);

}  // namespace torchlens

#endif  // TORCHLENS_DISPATCH_SOURCE_POSITIONS_H_
