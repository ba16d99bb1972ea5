#include "graph/zip_archive.h"

#include <zlib.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace torchlens {
namespace {

absl::Status Bad(absl::string_view why) { return absl::InvalidArgumentError(why); }

// Entry names come from the file: escaped, so that a message stays one printable line.
std::string Printable(absl::string_view name) { return absl::CHexEscape(name); }

// Little-endian reads of bounds-checked positions.
class Bytes {
 public:
  explicit Bytes(absl::string_view data) : data_(data) {}
  uint64_t size() const { return data_.size(); }
  bool Has(uint64_t at, uint64_t n) const { return at <= data_.size() && n <= data_.size() - at; }
  uint64_t Read(uint64_t at, int n) const {
    uint64_t value = 0;
    for (int i = n - 1; i >= 0; --i) value = (value << 8) | static_cast<uint8_t>(data_[at + i]);
    return value;
  }
  absl::string_view View(uint64_t at, uint64_t n) const { return data_.substr(at, n); }

 private:
  absl::string_view data_;
};

constexpr uint32_t kEndOfDirectory = 0x06054b50;
constexpr uint32_t kZip64Locator = 0x07064b50;
constexpr uint32_t kZip64EndOfDirectory = 0x06064b50;
constexpr uint32_t kDirectoryEntry = 0x02014b50;
constexpr uint32_t kLocalHeader = 0x04034b50;
constexpr uint64_t kStored = 0;
constexpr uint64_t kDeflated = 8;
constexpr uint64_t kDosDirectoryAttribute = 0x10;
// No deflate stream expands by more than this (a 258-byte match costs at least two
// bits, so about 1032x); the slack covers tiny streams.
constexpr uint64_t kMaxDeflateRatio = 1032;
constexpr uint64_t kDeflateSlack = 1024;

}  // namespace

absl::StatusOr<ZipArchive> ZipArchive::Open(absl::string_view data) {
  const Bytes bytes(data);
  if (bytes.size() < 22) return Bad("too short for a zip archive");
  // The end-of-central-directory record: last 22 bytes, before any trailing comment.
  uint64_t eocd = UINT64_MAX;
  const uint64_t lowest = bytes.size() > 22 + 65535 ? bytes.size() - 22 - 65535 : 0;
  for (uint64_t at = bytes.size() - 22 + 1; at-- > lowest;) {
    if (bytes.Read(at, 4) == kEndOfDirectory) {
      eocd = at;
      break;
    }
  }
  if (eocd == UINT64_MAX) return Bad("no zip end-of-directory record (truncated?)");
  uint64_t entries = bytes.Read(eocd + 10, 2);
  uint64_t directory_size = bytes.Read(eocd + 12, 4);
  uint64_t directory_offset = bytes.Read(eocd + 16, 4);
  if (eocd >= 20 && bytes.Read(eocd - 20, 4) == kZip64Locator) {
    const uint64_t zip64 = bytes.Read(eocd - 20 + 8, 8);
    if (!bytes.Has(zip64, 56) || bytes.Read(zip64, 4) != kZip64EndOfDirectory) {
      return Bad("a zip64 locator points outside the file");
    }
    entries = bytes.Read(zip64 + 32, 8);
    directory_size = bytes.Read(zip64 + 40, 8);
    directory_offset = bytes.Read(zip64 + 48, 8);
  }
  if (!bytes.Has(directory_offset, directory_size)) {
    return Bad("the zip directory lies outside the file");
  }
  // Each directory entry takes at least 46 bytes: a count beyond that is a lie.
  if (entries > directory_size / 46)
    return Bad("the zip directory claims more entries than it holds");
  ZipArchive archive;
  archive.bytes_ = data;
  // Each entry's bytes, local header to data end, for the overlap check below.
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  spans.reserve(entries);
  uint64_t at = directory_offset;
  for (uint64_t index = 0; index < entries; ++index) {
    if (!bytes.Has(at, 46) || bytes.Read(at, 4) != kDirectoryEntry) {
      return Bad("a zip directory entry is malformed");
    }
    const uint64_t method = bytes.Read(at + 10, 2);
    const uint32_t crc = static_cast<uint32_t>(bytes.Read(at + 16, 4));
    uint64_t compressed = bytes.Read(at + 20, 4);
    uint64_t size = bytes.Read(at + 24, 4);
    const uint64_t name_length = bytes.Read(at + 28, 2);
    const uint64_t extra_length = bytes.Read(at + 30, 2);
    const uint64_t comment_length = bytes.Read(at + 32, 2);
    const uint64_t external_attributes = bytes.Read(at + 38, 4);
    uint64_t local = bytes.Read(at + 42, 4);
    if (!bytes.Has(at + 46, name_length + extra_length + comment_length)) {
      return Bad("a zip directory entry runs past the end");
    }
    Entry entry;
    entry.name = std::string(bytes.View(at + 46, name_length));
    // LibTorch's reader (miniz) takes an entry with the DOS directory attribute for a
    // directory whatever its name, and "reads" it by leaving the caller's buffer as it
    // was: a record named as a file but marked so would be uninitialized memory to
    // LibTorch and checked bytes to us.
    if ((external_attributes & kDosDirectoryAttribute) != 0 && !absl::EndsWith(entry.name, "/")) {
      return Bad(absl::StrCat("zip entry ", Printable(entry.name),
                              " is named as a file but marked as a directory (external "
                              "attributes 0x",
                              absl::Hex(external_attributes),
                              "); LibTorch's reader would read no bytes for it"));
    }
    // ZIP64 extra field: 64-bit sizes and offset for the fields saturated above.
    for (uint64_t x = at + 46 + name_length; x + 4 <= at + 46 + name_length + extra_length;) {
      const uint64_t id = bytes.Read(x, 2);
      const uint64_t length = bytes.Read(x + 2, 2);
      if (x + 4 + length > at + 46 + name_length + extra_length) break;
      if (id == 0x0001) {
        uint64_t field = x + 4;
        auto take = [&](uint64_t* value) {
          if (*value == 0xFFFFFFFF && field + 8 <= x + 4 + length) {
            *value = bytes.Read(field, 8);
            field += 8;
          }
        };
        take(&size);
        take(&compressed);
        take(&local);
      }
      x += 4 + length;
    }
    if (method == kStored) {
      if (compressed != size) {
        return Bad(
            absl::StrCat("stored zip entry ", Printable(entry.name), " has two different sizes"));
      }
    } else if (method == kDeflated) {
      if (size > compressed * kMaxDeflateRatio + kDeflateSlack) {
        return Bad(absl::StrCat("zip entry ", Printable(entry.name), " claims ", size,
                                " bytes from ", compressed,
                                " deflated bytes, more than deflate can produce"));
      }
      // miniz likewise returns an entry with no compressed bytes without writing any.
      if (compressed == 0 && size > 0) {
        return Bad(absl::StrCat("zip entry ", Printable(entry.name), " claims ", size,
                                " bytes from no deflated bytes"));
      }
      entry.deflated = true;
    } else {
      return Bad(absl::StrCat("zip entry ", Printable(entry.name), " uses compression method ",
                              method, "; torch.save stores entries or deflates them"));
    }
    if (!bytes.Has(local, 30) || bytes.Read(local, 4) != kLocalHeader) {
      return Bad(absl::StrCat("zip entry ", Printable(entry.name), " points outside the file"));
    }
    entry.data_offset = local + 30 + bytes.Read(local + 26, 2) + bytes.Read(local + 28, 2);
    entry.stored_size = compressed;
    entry.size = size;
    entry.crc32 = crc;
    if (!bytes.Has(entry.data_offset, compressed)) {
      return Bad(absl::StrCat("zip entry ", Printable(entry.name), " claims ", compressed,
                              " bytes past the end"));
    }
    if (!archive.by_name_.emplace(absl::AsciiStrToLower(entry.name), archive.entries_.size())
             .second) {
      return Bad(absl::StrCat("zip entry ", Printable(entry.name),
                              " appears twice (names are compared without regard to case, as "
                              "LibTorch's reader compares them)"));
    }
    spans.emplace_back(local, entry.data_offset + compressed);
    archive.entries_.push_back(std::move(entry));
    at += 46 + name_length + extra_length + comment_length;
  }
  if (archive.entries_.empty()) return Bad("a zip archive without entries");
  // Entries sharing bytes: 2,000 directory entries naming one deflated record of 64 MB of
  // zeros make a 300 KB file that inflates to 128 GB, which the bound on inflated size
  // (each entry's deflate ratio, so the file's size) assumes cannot happen. Zip writers
  // give every entry bytes of its own.
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i) {
    if (spans[i].first < spans[i - 1].second) {
      return Bad(absl::StrCat("two zip entries share the bytes at offset ", spans[i].first,
                              "; each entry of a zip archive has bytes of its own"));
    }
  }
  // As LibTorch's reader: every record lives in the first entry's directory.
  const std::string& first = archive.entries_.front().name;
  const size_t slash = first.find('/');
  if (slash == std::string::npos) {
    return Bad(absl::StrCat("zip entry ", Printable(first),
                            " is not in a directory, as torch.save writes"));
  }
  archive.prefix_ = first.substr(0, slash + 1);
  for (const Entry& entry : archive.entries_) {
    const absl::string_view name = entry.name;
    if (absl::StartsWithIgnoreCase(name, archive.prefix_) &&
        !absl::StartsWith(name, archive.prefix_)) {
      return Bad(absl::StrCat("zip entry ", Printable(entry.name),
                              " lies in a folder that differs from the archive's folder ",
                              Printable(archive.prefix_),
                              " only in case; LibTorch's reader would read it as a record of "
                              "that folder"));
    }
  }
  return archive;
}

const ZipArchive::Entry* ZipArchive::Find(absl::string_view name) const {
  auto it = by_name_.find(absl::AsciiStrToLower(absl::StrCat(prefix_, name)));
  return it == by_name_.end() ? nullptr : &entries_[it->second];
}

absl::StatusOr<std::string> ZipArchive::Read(absl::string_view name) const {
  const Entry* entry = Find(name);
  if (entry == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("the archive has no record ", Printable(absl::StrCat(prefix_, name))));
  }
  return Read(*entry);
}

absl::StatusOr<std::string> ZipArchive::Read(const Entry& entry) const {
  const absl::string_view stored = Stored(entry);
  if (!entry.deflated) return std::string(stored);
  if (entry.size > UINT_MAX || entry.stored_size > UINT_MAX) {  // zlib counts in 32 bits
    return absl::InvalidArgumentError(
        absl::StrCat("deflated zip entry ", Printable(entry.name),
                     " is larger than 4 GiB; torch.save stores large records"));
  }
  std::string out(entry.size, '\0');
  z_stream stream{};
  if (inflateInit2(&stream, -MAX_WBITS) != Z_OK) {  // raw deflate, as zip stores it
    return absl::InternalError("zlib: cannot start inflating");
  }
  stream.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(stored.data()));
  stream.avail_in = static_cast<uInt>(stored.size());
  stream.next_out = reinterpret_cast<Bytef*>(out.data());
  stream.avail_out = static_cast<uInt>(out.size());
  const int result = inflate(&stream, Z_FINISH);
  const uint64_t inflated = stream.total_out;
  inflateEnd(&stream);
  if (result != Z_STREAM_END || inflated != out.size()) {
    return absl::InvalidArgumentError(absl::StrCat("zip entry ", Printable(entry.name),
                                                   " does not inflate to its stated ", entry.size,
                                                   " bytes"));
  }
  return out;
}

absl::Status ZipArchive::CheckCrc(const Entry& entry) const {
  std::string inflated;
  absl::string_view data = Stored(entry);
  if (entry.deflated) {
    absl::StatusOr<std::string> read = Read(entry);
    if (!read.ok()) return read.status();
    inflated = *std::move(read);
    data = inflated;
  }
  uLong crc = crc32(0L, Z_NULL, 0);
  for (size_t at = 0; at < data.size();) {  // zlib counts in 32 bits
    const size_t chunk = std::min<size_t>(data.size() - at, size_t{1} << 30);
    crc = crc32(crc, reinterpret_cast<const Bytef*>(data.data() + at), static_cast<uInt>(chunk));
    at += chunk;
  }
  if (static_cast<uint32_t>(crc) != entry.crc32) {
    return absl::InvalidArgumentError(absl::StrCat(
        "zip entry ", Printable(entry.name), " fails its CRC-32 check (the file is corrupt)"));
  }
  return absl::OkStatus();
}

}  // namespace torchlens
