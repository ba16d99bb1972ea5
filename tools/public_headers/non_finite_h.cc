// Compiles graph/non_finite.h first and alone: it must include everything it uses.
#include "graph/non_finite.h"

namespace torchlens {
int non_finite_header_compiles() { return 0; }
}  // namespace torchlens
