// Compiles graph/compare.h first and alone: it must include everything it uses.
#include "graph/compare.h"

namespace torchlens {
int compare_header_compiles() { return 0; }
}  // namespace torchlens
