#include "graph/mapped_storage.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <utility>

namespace torchlens {
namespace {

struct MappedRecord {
  absl::string_view mapping;
  std::shared_ptr<void> owner;
};

// The deleter of StorageOverMapping's storages, also how MappingOf knows them.
void DeleteRecord(void* record) { delete static_cast<MappedRecord*>(record); }

}  // namespace

at::Storage StorageOverMapping(char* data, size_t bytes, absl::string_view mapping,
                               std::shared_ptr<void> owner) {
  auto* record = new MappedRecord{mapping, std::move(owner)};
  return at::Storage(c10::Storage::use_byte_size_t(), bytes,
                     c10::DataPtr(data, record, &DeleteRecord, c10::Device(c10::kCPU)),
                     /*allocator=*/nullptr, /*resizable=*/false);
}

std::optional<absl::string_view> MappingOf(const c10::Storage& storage) {
  const c10::DataPtr& data = storage.data_ptr();
  if (data.get_deleter() != &DeleteRecord) return std::nullopt;
  return static_cast<const MappedRecord*>(data.get_context())->mapping;
}

void ReleaseMappedPages(const char* begin, const char* end) {
  // See NOTE [Giving back a mapped value's pages].
  static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t first = reinterpret_cast<uintptr_t>(begin) & ~(page - 1);
  const uintptr_t last = (reinterpret_cast<uintptr_t>(end) + page - 1) & ~(page - 1);
  if (last <= first) return;
  // Advice only: an error (an old kernel without MADV_PAGEOUT) leaves the pages resident.
  ::madvise(reinterpret_cast<void*>(first), last - first, MADV_PAGEOUT);
}

}  // namespace torchlens
