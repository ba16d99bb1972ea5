// Checking untrusted `torch.save` bytes before LibTorch reads them.
//
// NOTE [Untrusted archives]
// LibTorch 1.13 trusts what an archive says about itself: its zip reader allocates the
// sizes the central directory states, and its unpickler allocates the lengths the pickle
// opcodes state, before reading any of it. A few corrupted bytes can therefore ask for
// gigabytes. `CheckTorchArchive` walks the zip directory and the pickle opcode stream of
// `data.pkl` and rejects any size or length that points past the end of the file, so that
// what LibTorch then allocates is bounded by the file size. It accepts exactly the
// archives `torch.save` and `torch::pickle_save` write (stored zip entries, pickle
// protocol 2 opcodes).
#ifndef TORCHLENS_GRAPH_ARCHIVE_CHECK_H_
#define TORCHLENS_GRAPH_ARCHIVE_CHECK_H_

#include <vector>

#include "absl/status/status.h"

namespace torchlens {

// kInvalidArgument naming what is wrong, or OK.
absl::Status CheckTorchArchive(const std::vector<char>& bytes);

}  // namespace torchlens

#endif  // TORCHLENS_GRAPH_ARCHIVE_CHECK_H_
