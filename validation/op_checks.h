// Checking every node of a trace against its saved values: what ValidateForwardPass
// (validate.h) runs.
//
// Each op is re-run from its saved arguments (replay.h) and must give its saved outputs;
// each argument must be the saved value of the node its source names; each parent must be
// able to change the output (perturbation_check.h); each write through an alias and each
// fused buffer write must be what redoing it gives (fused_views.h); each output and buffer
// version must be the value its producer gave. What the checks find becomes the report
// (verdicts.h).
#ifndef TORCHLENS_VALIDATION_OP_CHECKS_H_
#define TORCHLENS_VALIDATION_OP_CHECKS_H_

#include <cstddef>

#include "graph/trace.h"
#include "validation/validation_report.h"

namespace torchlens {

// NOTE [Validating on several threads]
// Every op is checked from its own saved values, so ops can be checked in any order and on
// any thread. Each thread runs a checker that takes the next unchecked op from a shared
// counter until none is left (ops differ in cost by orders of magnitude, a convolution
// against a view, so a fixed split leaves one thread idle); each op's perturbations draw
// from a generator seeded with the op's position, so the report does not depend on the
// thread count or on which thread checked which op. Lines are tagged with the position of
// the op they are about and merged in trace order. Buffer versions are checked afterwards,
// on one thread, from what the ops' checks established.

// The report on `trace` (which holds saved values), its ops checked on up to `threads`
// threads. Never throws: a check that throws is a verdict on its op.
ValidationReport CheckTrace(const Trace& trace, size_t threads);

}  // namespace torchlens

#endif  // TORCHLENS_VALIDATION_OP_CHECKS_H_
