// Compiles validation/intervene.h first and alone: it must include everything it uses.
#include "validation/intervene.h"

namespace torchlens {
int intervene_header_compiles() { return 0; }
}  // namespace torchlens
