// Storages made over the bytes of a mapped file, and giving their pages back.
//
//   at::Storage s = torchlens::StorageOverMapping(data, bytes, file, owner);  // no copy
//   ...use tensors over `s`; each page is read from disk on first use...
//   torchlens::ReleaseMappedPages(file.data(), file.data() + file.size());  // done with it
#ifndef TORCHLENS_GRAPH_MAPPED_STORAGE_H_
#define TORCHLENS_GRAPH_MAPPED_STORAGE_H_

#include <c10/core/Storage.h>

#include <cstddef>
#include <memory>
#include <optional>

#include "absl/strings/string_view.h"

namespace torchlens {

// A storage of `bytes` bytes at `data`, inside `mapping` (the whole mapped file), which
// `owner` keeps alive: every storage made so holds a reference to `owner`. Not resizable.
at::Storage StorageOverMapping(char* data, size_t bytes, absl::string_view mapping,
                               std::shared_ptr<void> owner);

// The mapping a StorageOverMapping storage lies in; nullopt for any other storage.
std::optional<absl::string_view> MappingOf(const c10::Storage& storage);

// NOTE [Giving back a mapped value's pages]
// A value made over a mapped file (NOTE [Values read on use] in graph/trace_file.h) stays
// resident once read: the kernel keeps the pages mapped into the process until memory runs
// short, so a walk over a trace larger than memory would grow to the file's size, and
// would push out of memory whatever else runs. A walk that is done with some of the file
// gives its pages back (MADV_PAGEOUT): they are reclaimed, and read from disk again if
// used again. The advice never loses data: a page this process wrote is a private copy,
// which is only swapped out (or, without swap, kept). The kernel reclaims a file's pages
// only for a process that could open the file for writing (its own trace files); for
// others the call does nothing and the pages stay until memory runs short, as before. The
// page cache holds a file's pages in folios of up to 2 MiB, and the kernel skips a folio
// that the advised range covers only in part: what is given back must be whole windows
// of kReleaseWindow bytes (NOTE [Releasing after the last use] says how a walk finds them).
inline constexpr size_t kReleaseWindow = size_t{2} << 20;

// Gives back the pages of [begin, end), a part of one mapping of StorageOverMapping's.
void ReleaseMappedPages(const char* begin, const char* end);

}  // namespace torchlens

#endif  // TORCHLENS_GRAPH_MAPPED_STORAGE_H_
