// Compiles graph/structure_hash.h first and alone: it must include everything it uses.
#include "graph/structure_hash.h"

namespace torchlens {
int structure_hash_header_compiles() { return 0; }
}  // namespace torchlens
