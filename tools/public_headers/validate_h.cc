// Compiles validation/validate.h first and alone: it must include everything it uses.
#include "validation/validate.h"

namespace torchlens {
int validate_header_compiles() { return 0; }
}  // namespace torchlens
