// Compiles graph/render.h first and alone: it must include everything it uses.
#include "graph/render.h"

namespace torchlens {
int render_header_compiles() { return 0; }
}  // namespace torchlens
