// The zip container of `torch.save` and `torch.jit.save` files, read from untrusted bytes.
//
//   absl::StatusOr<ZipArchive> zip = ZipArchive::Open(bytes);
//   if (!zip.ok()) return zip.status();
//   absl::StatusOr<std::string> pickle = zip->Read("data.pkl");  // "archive/data.pkl"
//
// NOTE [Untrusted archives]
// LibTorch 1.13 trusts what an archive says about itself: its zip reader allocates the
// sizes the central directory states, and its unpickler allocates the lengths the pickle
// opcodes state, before reading any of it. A few corrupted bytes can therefore ask for
// gigabytes, or point reads past the end of the buffer. `ZipArchive::Open` walks the
// central directory and every local header and rejects any entry whose name, header or
// data lies outside the file, whose method is neither stored nor deflated, or whose
// stated size a deflate stream of its length cannot produce (so that what is inflated is
// bounded by the file size). Entry names must be unique: LibTorch finds records by name,
// and a check must look at the entry LibTorch will read. LibTorch's reader (miniz) compares
// names without regard to ASCII case, so uniqueness and lookups here do too, and an entry
// whose folder differs from the archive's folder only in case is refused: LibTorch would
// read "M/code/x.debug_pkl" as the record "m/code/x.debug_pkl", which a check going by
// the exact folder would skip (fuzzing: such a debug record ended the process). In archives
// LibTorch reads (model archives) every entry's CRC-32 is verified too (CheckCrc, called by
// archive_check.h): LibTorch's reader hands out uninitialized bytes for a record whose CRC fails
// (fuzzing: a debug record read that way ended the process while LibTorch printed a compile error).
// torch.save data and trace files are read by torchlens itself, which takes the bytes as
// they are. The pickle programs inside are checked by archive_check.h.
#ifndef TORCHLENS_GRAPH_ZIP_ARCHIVE_H_
#define TORCHLENS_GRAPH_ZIP_ARCHIVE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace torchlens {

class ZipArchive {
 public:
  struct Entry {
    std::string name;  // the full name, "archive/data/0"
    uint64_t data_offset = 0;
    uint64_t stored_size = 0;  // bytes in the file
    uint64_t size = 0;         // bytes once inflated
    bool deflated = false;
    uint32_t crc32 = 0;  // of the inflated bytes, as the directory states it
  };

  // Checks the directory as NOTE [Untrusted archives] says. `bytes` must outlive the
  // archive. kInvalidArgument naming what is wrong.
  static absl::StatusOr<ZipArchive> Open(absl::string_view bytes);

  // The records are named relative to the directory every entry lies in, as LibTorch
  // names them: the directory of the first entry ("archive/" for "archive/data.pkl").
  const std::string& prefix() const { return prefix_; }
  const std::vector<Entry>& entries() const { return entries_; }
  // The entry of record `name` ("data.pkl" for "archive/data.pkl"), or nullptr.
  const Entry* Find(absl::string_view name) const;
  // A record's content, inflated if deflated. kNotFound for a missing record,
  // kInvalidArgument for a corrupt deflate stream.
  absl::StatusOr<std::string> Read(absl::string_view name) const;
  absl::StatusOr<std::string> Read(const Entry& entry) const;

  // kInvalidArgument naming the entry when its bytes fail its CRC-32 (see NOTE [Untrusted
  // archives] for which archives must pass this).
  absl::Status CheckCrc(const Entry& entry) const;
  // A record's bytes as the file holds them, in place (compressed when deflated).
  absl::string_view Stored(const Entry& entry) const {
    return bytes_.substr(entry.data_offset, entry.stored_size);
  }

 private:
  absl::string_view bytes_;
  std::string prefix_;
  std::vector<Entry> entries_;
  absl::flat_hash_map<std::string, size_t> by_name_;
};

}  // namespace torchlens

#endif  // TORCHLENS_GRAPH_ZIP_ARCHIVE_H_
