// Compiles graph/trace.h first and alone: it must include everything it uses.
#include "graph/trace.h"

namespace torchlens {
int trace_header_compiles() { return 0; }
}  // namespace torchlens
