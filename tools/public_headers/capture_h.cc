// Compiles torchlens_dispatch/capture.h first and alone: it must include everything it uses.
#include "torchlens_dispatch/capture.h"

namespace torchlens {
int capture_header_compiles() { return 0; }
}  // namespace torchlens
