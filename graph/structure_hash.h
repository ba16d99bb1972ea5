// A fingerprint of a trace's structure, for pinning a model's graph in a test.
//
//   EXPECT_EQ(torchlens::StructureHash(*trace), "6f1d0c3a9b2e4d17");
//
// The hash covers, for every node in execution order: its kind and type, operator and
// overload, module address, layer numbers and pass, output shape and dtype, its parents
// (by position) and, for buffer versions, the address and write kind. It does not cover
// tensor values, so it is the same for any inputs of the same shapes, from run to run and
// from machine to machine (a fixed 64-bit FNV-1a over a fixed encoding, independent of
// pointer values and of Abseil's per-process hash seed). It changes when an op, an edge, a
// shape, a dtype or a module changes.
#ifndef TORCHLENS_GRAPH_STRUCTURE_HASH_H_
#define TORCHLENS_GRAPH_STRUCTURE_HASH_H_

#include <string>

#include "graph/trace.h"

namespace torchlens {

// 16 lowercase hex digits.
std::string StructureHash(const Trace& trace);

}  // namespace torchlens

#endif  // TORCHLENS_GRAPH_STRUCTURE_HASH_H_
