#include "graph/archive_check.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace torchlens {
namespace {

absl::Status Bad(absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("not a valid torch.save archive: ", why));
}

// Little-endian reads that fail instead of reading past the end.
class Bytes {
 public:
  explicit Bytes(const std::vector<char>& data) : data_(data) {}
  uint64_t size() const { return data_.size(); }
  bool Has(uint64_t at, uint64_t n) const { return at <= data_.size() && n <= data_.size() - at; }
  uint64_t Read(uint64_t at, int n) const {
    uint64_t value = 0;
    for (int i = n - 1; i >= 0; --i) value = (value << 8) | static_cast<uint8_t>(data_[at + i]);
    return value;
  }
  absl::string_view View(uint64_t at, uint64_t n) const { return {data_.data() + at, n}; }

 private:
  const std::vector<char>& data_;
};

constexpr uint32_t kEndOfDirectory = 0x06054b50;
constexpr uint32_t kZip64Locator = 0x07064b50;
constexpr uint32_t kZip64EndOfDirectory = 0x06064b50;
constexpr uint32_t kDirectoryEntry = 0x02014b50;
constexpr uint32_t kLocalHeader = 0x04034b50;

// Pickle protocol 2 opcodes (and the protocol-4 ones the unpickler accepts), with the
// size of their fixed argument; -1 marks a length-prefixed argument handled separately.
int FixedArgument(uint8_t op) {
  switch (op) {
    case 0x80:
      return 1;  // PROTO
    case 'q':
      return 1;  // BINPUT
    case 'r':
      return 4;  // LONG_BINPUT
    case 'h':
      return 1;  // BINGET
    case 'j':
      return 4;  // LONG_BINGET
    case 'J':
      return 4;  // BININT
    case 'K':
      return 1;  // BININT1
    case 'M':
      return 2;  // BININT2
    case 'G':
      return 8;  // BINFLOAT
    case 0x95:
      return 8;  // FRAME
    case '(':
    case '}':
    case ']':
    case ')':
    case 0x85:
    case 0x86:
    case 0x87:
    case 't':
    case 'Q':
    case 'R':
    case 'b':
    case 's':
    case 'u':
    case 'e':
    case 'a':
    case 0x88:
    case 0x89:
    case 'N':
    case 0x81:
    case 0x94:
    case '.':
      return 0;
    default:
      return -1;
  }
}

// NOTE [Pickle stack depth]
// LibTorch's unpickler pops its value stack without checking its size: a TUPLE2 with one
// value on the stack reads below it, and the REDUCE after it freed memory it never
// allocated (found by fuzzing). The check runs the pickle program on stack heights alone:
// every opcode must find the values it consumes above the innermost MARK, mark-ended
// opcodes need their MARK (and SETITEMS its key-value pairs, APPENDS/SETITEMS the
// container below the MARK), and STOP must leave exactly one value.
class StackHeights {
 public:
  absl::Status Apply(uint8_t op) {
    switch (op) {
      case 0x80:  // PROTO
      case 0x95:  // FRAME
        return absl::OkStatus();
      case '(':  // MARK
        marks_.push_back(depth_);
        return absl::OkStatus();
      case 'q':   // BINPUT
      case 'r':   // LONG_BINPUT
      case 0x94:  // MEMOIZE
      case 'Q':   // BINPERSID
      case 0x85:  // TUPLE1
        return Consume(op, 1);
      case 0x86:  // TUPLE2
      case 'R':   // REDUCE
      case 'b':   // BUILD
      case 0x81:  // NEWOBJ
      case 'a':   // APPEND
        return Consume(op, 2);
      case 0x87:  // TUPLE3
      case 's':   // SETITEM
        return Consume(op, 3);
      case 't':  // TUPLE
      case 'e':  // APPENDS
      case 'u':  // SETITEMS
        return EndMark(op);
      case '.':  // STOP
        if (depth_ != 1 || !marks_.empty()) {
          return Bad("the pickle program stops without exactly one value");
        }
        return absl::OkStatus();
      default:  // every other accepted opcode pushes one value
        ++depth_;
        return absl::OkStatus();
    }
  }

 private:
  uint64_t Floor() const { return marks_.empty() ? 0 : marks_.back(); }
  // An opcode that pops `pops` values and pushes its result.
  absl::Status Consume(uint8_t op, uint64_t pops) {
    if (depth_ - Floor() < pops) return Underflow(op);
    depth_ = depth_ - pops + 1;
    return absl::OkStatus();
  }
  absl::Status EndMark(uint8_t op) {
    if (marks_.empty()) return Underflow(op);
    const uint64_t mark = marks_.back();
    marks_.pop_back();
    if (op == 't') {
      depth_ = mark + 1;
      return absl::OkStatus();
    }
    // APPENDS and SETITEMS add to the container just below their MARK.
    if (mark - Floor() < 1 || (op == 'u' && (depth_ - mark) % 2 != 0)) return Underflow(op);
    depth_ = mark;
    return absl::OkStatus();
  }
  static absl::Status Underflow(uint8_t op) {
    return Bad(absl::StrCat("pickle opcode 0x", absl::Hex(op),
                            " takes values the stack does not hold"));
  }

  uint64_t depth_ = 0;
  std::vector<uint64_t> marks_;
};

absl::Status CheckPickle(const Bytes& bytes, uint64_t begin, uint64_t end) {
  uint64_t at = begin;
  // Memo ids: writers number them from 0, one per put. The unpickler reserves room for
  // twice the id it is given, so an id beyond the puts so far asks for memory at will.
  uint64_t puts = 0;
  StackHeights stack;  // NOTE [Pickle stack depth]
  while (at < end) {
    const uint8_t op = static_cast<uint8_t>(bytes.View(at, 1)[0]);
    ++at;
    if (absl::Status s = stack.Apply(op); !s.ok()) return s;
    if (op == '.') return absl::OkStatus();  // STOP
    const int fixed = FixedArgument(op);
    if (fixed >= 0) {
      if (at + fixed > end) return Bad("a pickle opcode runs past the end of data.pkl");
      if (op == 'q' || op == 'r' || op == 'h' || op == 'j') {
        const uint64_t id = bytes.Read(at, fixed);
        const bool put = op == 'q' || op == 'r';
        if (put ? id > puts : id >= puts) {
          return Bad(absl::StrCat("a pickle memo id ", id, " with ", puts, " values memoized"));
        }
        if (put && id == puts) ++puts;
      } else if (op == 0x94) {  // MEMOIZE
        ++puts;
      }
      at += fixed;
      continue;
    }
    uint64_t length_size = 0;
    switch (op) {
      case 'X':
      case 'B':
        length_size = 4;
        break;  // BINUNICODE, BINBYTES
      case 0x8c:
      case 'C':
      case 0x8a:
        length_size = 1;
        break;  // SHORT_BINUNICODE, SHORT_BINBYTES, LONG1
      case 0x8d:
      case 0x8e:
        length_size = 8;
        break;     // BINUNICODE8, BINBYTES8
      case 'c': {  // GLOBAL: two text lines
        for (int line = 0; line < 2; ++line) {
          while (at < end && bytes.View(at, 1)[0] != '\n') ++at;
          if (at >= end) return Bad("a pickle GLOBAL runs past the end of data.pkl");
          ++at;
        }
        continue;
      }
      default:
        return Bad(absl::StrCat("unexpected pickle opcode 0x", absl::Hex(op)));
    }
    if (at + length_size > end) return Bad("a pickle length runs past the end of data.pkl");
    const uint64_t length = bytes.Read(at, static_cast<int>(length_size));
    at += length_size;
    if (length > end - at) {
      return Bad(absl::StrCat("a pickle value claims ", length, " bytes, ", end - at, " remain"));
    }
    at += length;
  }
  return Bad("data.pkl ends without a STOP opcode");
}

}  // namespace

absl::Status CheckTorchArchive(const std::vector<char>& data) {
  const Bytes bytes(data);
  if (bytes.size() < 22) return Bad("too short to be a zip archive");
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
  uint64_t at = directory_offset;
  uint64_t pickle_begin = 0, pickle_end = 0;
  bool has_pickle = false;
  for (uint64_t entry = 0; entry < entries; ++entry) {
    if (!bytes.Has(at, 46) || bytes.Read(at, 4) != kDirectoryEntry) {
      return Bad("a zip directory entry is malformed");
    }
    const uint64_t method = bytes.Read(at + 10, 2);
    uint64_t compressed = bytes.Read(at + 20, 4);
    uint64_t size = bytes.Read(at + 24, 4);
    const uint64_t name_length = bytes.Read(at + 28, 2);
    const uint64_t extra_length = bytes.Read(at + 30, 2);
    const uint64_t comment_length = bytes.Read(at + 32, 2);
    uint64_t local = bytes.Read(at + 42, 4);
    if (!bytes.Has(at + 46, name_length + extra_length + comment_length)) {
      return Bad("a zip directory entry runs past the end");
    }
    const absl::string_view name = bytes.View(at + 46, name_length);
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
    if (method != 0 || compressed != size) {
      return Bad(absl::StrCat("zip entry ", name, " is compressed; torch.save stores entries"));
    }
    if (!bytes.Has(local, 30) || bytes.Read(local, 4) != kLocalHeader) {
      return Bad(absl::StrCat("zip entry ", name, " points outside the file"));
    }
    const uint64_t data = local + 30 + bytes.Read(local + 26, 2) + bytes.Read(local + 28, 2);
    if (!bytes.Has(data, size)) {
      return Bad(absl::StrCat("zip entry ", name, " claims ", size, " bytes past the end"));
    }
    if (absl::EndsWith(name, "/data.pkl")) {
      has_pickle = true;
      pickle_begin = data;
      pickle_end = data + size;
    }
    at += 46 + name_length + extra_length + comment_length;
  }
  if (!has_pickle) return Bad("no data.pkl record");
  return CheckPickle(bytes, pickle_begin, pickle_end);
}

}  // namespace torchlens
