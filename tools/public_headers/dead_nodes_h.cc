// Compiles graph/dead_nodes.h first and alone: it must include everything it uses.
#include "graph/dead_nodes.h"

namespace torchlens {
int dead_nodes_header_compiles() { return 0; }
}  // namespace torchlens
