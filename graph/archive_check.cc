#include "graph/archive_check.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"

namespace torchlens {
namespace {

using Kind = PickleNode::Kind;

// Names the tensors of a run pickle by where they sit, and refuses values that contain
// themselves, nest deeper than their file kind allows (NOTE [Pickle nesting by file kind])
// or expand past kMaxPickleExpandedValues:
// LibTorch walks loaded values recursively (restoring type tags, freeing), which a cycle or
// a deep chain overflows, and every walk after loading follows each path. Depths recorded
// while the program ran can be stale (a list filled after it was put in another), so the
// walk counts its own.
class TensorNamer {
 public:
  TensorNamer(const PickleValues& values, uint32_t max_nesting)
      : values_(values),
        max_nesting_(max_nesting),
        state_(values.nodes.size(), kUnvisited),
        expanded_(values.nodes.size(), 1) {}

  absl::Status Walk(std::vector<std::string>* names) {
    names_.assign(values_.tensors.size(), "(unreachable)");
    // An explicit stack, not recursion: values may nest thousands of levels deep, and the
    // walk must not need that many native frames (under AddressSanitizer, 10,000 frames
    // overflow an 8 MB stack).
    std::string path;
    std::vector<Frame> stack;
    if (absl::Status s = Enter(values_.root, 0, 0, &path, &stack); !s.ok()) return s;
    while (!stack.empty()) {
      Frame& frame = stack.back();
      uint32_t child = kNoNode;
      std::string step;
      bool state_dict = false;
      if (!NextChild(&frame, path, &child, &step, &state_dict)) {
        state_[frame.id] = kDone;
        expanded_[frame.id] = frame.expanded;
        const uint32_t done = frame.id;
        path.resize(frame.restore);
        stack.pop_back();
        if (!stack.empty()) {
          if (absl::Status s = Count(done, &stack.back()); !s.ok()) return s;
        }
        continue;
      }
      const uint32_t depth = frame.depth;
      if (state_dict) {
        // An object's attributes: named "stem.weight", at the object's own depth.
        state_[child] = kVisiting;
        stack.push_back(Frame{child, depth, path.size(), 0, true});
        continue;
      }
      const size_t restore = path.size();
      path += step;
      const size_t frames = stack.size();
      if (absl::Status s = Enter(child, depth + 1, restore, &path, &stack); !s.ok()) return s;
      if (stack.size() == frames) {  // a leaf, or a container already walked
        if (absl::Status s = Count(child, &stack.back()); !s.ok()) return s;
      }
    }
    *names = std::move(names_);
    return absl::OkStatus();
  }

 private:
  enum State : uint8_t { kUnvisited, kVisiting, kDone };

  // A container being walked: its next child is `next` (for dicts, keys and values in
  // turn). `restore` is the path's length before this container's step.
  struct Frame {
    uint32_t id;
    uint32_t depth;
    size_t restore;
    size_t next;
    bool state_dict;        // an object's state dict: values are attributes
    uint64_t expanded = 1;  // itself and its children walked so far, as if unshared
  };

  absl::Status Enter(uint32_t id, uint32_t depth, size_t restore, std::string* path,
                     std::vector<Frame>* stack) {
    if (depth > max_nesting_) {
      return absl::InvalidArgumentError(
          absl::StrCat("values nest deeper than ", max_nesting_, " levels"));
    }
    if (state_[id] == kVisiting) {
      return absl::InvalidArgumentError(absl::StrCat("the value at '", *path, "' contains itself"));
    }
    const PickleNode& node = values_.nodes[id];
    if (state_[id] == kUnvisited) {
      switch (node.kind) {
        case Kind::kTuple:
        case Kind::kList:
        case Kind::kDict:
        case Kind::kObject:
          state_[id] = kVisiting;
          stack->push_back(Frame{id, depth, restore, 0, false});
          return absl::OkStatus();
        case Kind::kTensor:
          names_[node.index] = *path;
          break;
        default:
          break;
      }
      state_[id] = kDone;
    }
    path->resize(restore);  // shared values are named where first seen
    return absl::OkStatus();
  }

  // Adds walked node `child` to its container's count (kMaxPickleExpandedValues).
  absl::Status Count(uint32_t child, Frame* container) {
    container->expanded += expanded_[child];
    if (container->expanded <= kMaxPickleExpandedValues) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        "values hold more than ", kMaxPickleExpandedValues,
        " elements once shared containers are counted everywhere they appear (containers "
        "holding the same container many times over, nested): walking them would not end. "
        "torch.save of ordinary data does not write this; save the values without such "
        "sharing"));
  }

  // The frame's next child and the step that names it; false when there is none.
  bool NextChild(Frame* frame, const std::string& path, uint32_t* child, std::string* step,
                 bool* state_dict) const {
    const PickleNode& node = values_.nodes[frame->id];
    if (frame->state_dict || node.kind == Kind::kDict) {
      const size_t i = frame->next++;
      if ((i | 1) >= node.items.size()) return false;
      *child = node.items[i];
      if (i % 2 == 0) {
        *step = "(a key)";
        return true;
      }
      const PickleNode& key = values_.nodes[node.items[i - 1]];
      if (frame->state_dict) {
        const std::string attribute =
            key.kind == Kind::kString ? absl::CHexEscape(key.text) : std::string("?");
        *step = path.empty() ? attribute : absl::StrCat(".", attribute);
      } else {
        *step = key.kind == Kind::kString ? absl::StrCat("['", absl::CHexEscape(key.text), "']")
                : key.kind == Kind::kInt  ? absl::StrCat("[", key.int_value, "]")
                                          : std::string("[?]");
      }
      return true;
    }
    if (node.kind == Kind::kObject) {
      const size_t i = frame->next++;
      if (i == 0) {
        *child = node.items[1];
        *step = "(arguments)";
        return true;
      }
      if (i > 1 || node.state == kNoNode) return false;
      *child = node.state;
      step->clear();
      *state_dict =
          values_.nodes[node.state].kind == Kind::kDict && state_[node.state] == kUnvisited;
      return true;
    }
    const size_t i = frame->next++;  // a tuple or a list
    if (i >= node.items.size()) return false;
    *child = node.items[i];
    *step = absl::StrCat("[", i, "]");
    return true;
  }

  const PickleValues& values_;
  const uint32_t max_nesting_;
  std::vector<State> state_;
  std::vector<uint64_t> expanded_;  // of walked nodes: see Frame::expanded
  std::vector<std::string> names_;
};

std::string TensorName(const std::string& name) {
  return name.empty() ? std::string("the saved tensor") : absl::StrCat("tensor '", name, "'");
}

// NOTE [Pickled tensors]: storages against records, tensors against storages.
absl::Status CheckTensors(const PickleValues& values, const std::vector<std::string>& names,
                          const ZipArchive& zip, absl::string_view record_directory,
                          std::vector<ZipArchive::Entry>* records) {
  // The first tensor of each storage names it in messages.
  std::vector<int64_t> first_user(values.storages.size(), -1);
  for (size_t t = values.tensors.size(); t-- > 0;) first_user[values.tensors[t].storage] = t;
  records->clear();
  for (size_t i = 0; i < values.storages.size(); ++i) {
    const PickledStorage& storage = values.storages[i];
    const std::string record = absl::StrCat(record_directory, storage.key);
    const std::string of =
        first_user[i] < 0 ? std::string() : absl::StrCat(" of ", TensorName(names[first_user[i]]));
    const ZipArchive::Entry* entry = zip.Find(record);
    if (entry == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("storage ", absl::CHexEscape(record), of, " has no record in the archive"));
    }
    const absl::uint128 bytes = absl::uint128(storage.numel) * storage.item_size;
    if (bytes > entry->size) {
      return absl::InvalidArgumentError(
          absl::StrCat("storage ", absl::CHexEscape(record), of, " claims ", storage.numel, " ",
                       storage.dtype, " elements (",
                       bytes > UINT64_MAX ? std::string("2^64 or more")
                                          : absl::StrCat(static_cast<uint64_t>(bytes)),
                       " bytes), but its record holds ", entry->size, " bytes (truncated?)"));
    }
    records->push_back(*entry);
  }
  for (size_t t = 0; t < values.tensors.size(); ++t) {
    const PickledTensor& tensor = values.tensors[t];
    const PickledStorage& storage = values.storages[tensor.storage];
    const std::string shape =
        absl::StrCat(storage.dtype, ", sizes [", absl::StrJoin(tensor.sizes, ", "), "], strides [",
                     absl::StrJoin(tensor.strides, ", "), "], offset ", tensor.offset);
    if (tensor.sizes.size() != tensor.strides.size()) {
      return absl::InvalidArgumentError(absl::StrCat(TensorName(names[t]), " (", shape, ") has ",
                                                     tensor.sizes.size(), " sizes and ",
                                                     tensor.strides.size(), " strides"));
    }
    bool negative = tensor.offset < 0;
    for (size_t d = 0; d < tensor.sizes.size(); ++d) {
      negative = negative || tensor.sizes[d] < 0 || tensor.strides[d] < 0;
    }
    if (negative) {
      return absl::InvalidArgumentError(absl::StrCat(TensorName(names[t]), " (", shape,
                                                     ") has a negative size, stride or offset"));
    }
    absl::uint128 numel = 1;
    for (int64_t size : tensor.sizes) {
      numel *= static_cast<uint64_t>(size);
      if (numel > INT64_MAX) {
        return absl::InvalidArgumentError(
            absl::StrCat(TensorName(names[t]), " (", shape, ") has more than 2^63 - 1 elements"));
      }
    }
    if (numel == 0) continue;  // reads no element
    // The index of the last element it reads, saturated at 2^64.
    absl::uint128 last = static_cast<uint64_t>(tensor.offset);
    for (size_t d = 0; d < tensor.sizes.size() && last <= UINT64_MAX; ++d) {
      last += absl::uint128(static_cast<uint64_t>(tensor.sizes[d] - 1)) *
              static_cast<uint64_t>(tensor.strides[d]);
    }
    if (last >= storage.numel) {
      return absl::InvalidArgumentError(absl::StrCat(
          TensorName(names[t]), " (", shape, ") reaches element ",
          last > UINT64_MAX ? std::string("2^64 or beyond")
                            : absl::StrCat(static_cast<uint64_t>(last)),
          " of its storage ", absl::CHexEscape(absl::StrCat(record_directory, storage.key)),
          ", which holds ", storage.numel, " elements"));
    }
  }
  return absl::OkStatus();
}

// NOTE [Debug information]
// The debug information of a TorchScript archive (`code/**.debug_pkl`) maps byte offsets
// of the serialized code to ranges of the original Python source. LibTorch unpickles it
// lazily, while it formats an error message inside the noexcept `ErrorReport::what()`,
// and indexes it without checks: a throw there ends the process (fuzzing found one), a
// bad index reads out of bounds. The check accepts exactly the form LibTorch 1.13 writes:
//   ("FORMAT_WITH_STRING_TABLE", (text, ...), ((offset, range, handle), ...)), with
//   range = (((text index, ...) as build_intlist, filename index, line), start, end),
// or, without a string table, a tuple of (offset, range[, handle]) with
//   range = ((text, filename or None, line), start, end);
// every index inside the table, no negative range, and no other global than build_intlist,
// in LibTorch's pickle dialect.
class DebugInfoCheck {
 public:
  explicit DebugInfoCheck(const PickleValues& values) : values_(values) {}

  absl::Status Run() {
    for (const PickleNode& node : values_.nodes) {
      if ((node.kind == Kind::kGlobal && node.text != "torch.jit._pickle.build_intlist") ||
          node.kind == Kind::kObject || node.kind == Kind::kTensor || node.kind == Kind::kStorage ||
          node.kind == Kind::kDevice) {
        return Bad("values other than tuples, lists of ints, strings and ints");
      }
    }
    const PickleNode* root = Tuple(values_.root);
    if (root == nullptr) return Bad("it is not a tuple");
    const PickleNode* lines = root;
    if (!root->items.empty() && At(root->items[0]).kind == Kind::kString &&
        At(root->items[0]).text == "FORMAT_WITH_STRING_TABLE") {
      const PickleNode* table = root->items.size() == 3 ? Tuple(root->items[1]) : nullptr;
      lines = root->items.size() == 3 ? Tuple(root->items[2]) : nullptr;
      if (table == nullptr || lines == nullptr) return Bad("a malformed string table");
      for (uint32_t text : table->items) {
        if (At(text).kind != Kind::kString) return Bad("a string table holding a non-string");
      }
      table_size_ = table->items.size();
      with_table_ = true;
    }
    for (uint32_t id : lines->items) {
      const PickleNode* line = Tuple(id);
      if (line == nullptr || line->items.size() < 2 || line->items.size() > 3 ||
          At(line->items[0]).kind != Kind::kInt ||
          (line->items.size() == 3 && At(line->items[2]).kind != Kind::kInt)) {
        return Bad("a malformed line record");
      }
      if (absl::Status s = Range(line->items[1]); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

 private:
  static absl::Status Bad(absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("debug information LibTorch cannot read safely: ", why));
  }
  const PickleNode& At(uint32_t id) const { return values_.nodes[id]; }
  const PickleNode* Tuple(uint32_t id, size_t size = 0) const {
    const PickleNode& node = At(id);
    if (node.kind != Kind::kTuple || (size != 0 && node.items.size() != size)) return nullptr;
    return &node;
  }
  bool Int(uint32_t id) const { return At(id).kind == Kind::kInt; }

  absl::Status Range(uint32_t id) {
    const PickleNode* range = Tuple(id, 3);
    const PickleNode* source = range == nullptr ? nullptr : Tuple(range->items[0], 3);
    if (source == nullptr || !Int(range->items[1]) || !Int(range->items[2]) ||
        !Int(source->items[2])) {
      return Bad("a malformed source range");
    }
    if (with_table_) {
      const PickleNode& pieces = At(source->items[0]);
      if (pieces.kind != Kind::kList || pieces.type_tag != "List[int]" || !Int(source->items[1]) ||
          !InTable(At(source->items[1]).int_value)) {
        return Bad("a malformed source");
      }
      for (uint32_t piece : pieces.items) {
        if (!Int(piece) || !InTable(At(piece).int_value)) return Bad("a text index out of range");
      }
    } else {
      const PickleNode& text = At(source->items[0]);
      const Kind filename = At(source->items[1]).kind;
      if (text.kind != Kind::kString || (filename != Kind::kString && filename != Kind::kNone)) {
        return Bad("a malformed source");
      }
    }
    // Ranges may reach past their text (LibTorch writes [0, 1) over an empty source, and
    // clamps ranges where it prints them), but they are never negative.
    if (At(range->items[1]).int_value < 0 || At(range->items[2]).int_value < 0) {
      return Bad("a negative source range");
    }
    return absl::OkStatus();
  }
  bool InTable(int64_t index) const {
    return index >= 0 && static_cast<uint64_t>(index) < table_size_;
  }

  const PickleValues& values_;
  bool with_table_ = false;
  size_t table_size_ = 0;
};

struct RunPickleRecord {
  PickleValues values;
  std::vector<std::string> tensor_names;
  std::vector<ZipArchive::Entry> storage_records;
};

// Runs one pickle record and checks what it holds.
absl::StatusOr<RunPickleRecord> CheckPickleRecord(const ZipArchive& zip,
                                                  const ZipArchive::Entry& entry,
                                                  absl::string_view record_directory,
                                                  const PickleOptions& options) {
  const std::string where = absl::CHexEscape(entry.name);
  absl::StatusOr<std::string> program = zip.Read(entry);
  if (!program.ok()) return program.status();
  absl::StatusOr<PickleValues> values = RunPickle(*program, options);
  if (!values.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", values.status().message()));
  }
  RunPickleRecord run;
  run.values = *std::move(values);
  if (absl::Status s = TensorNamer(run.values, options.max_nesting).Walk(&run.tensor_names);
      !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", s.message()));
  }
  if (absl::Status s =
          CheckTensors(run.values, run.tensor_names, zip, record_directory, &run.storage_records);
      !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", s.message()));
  }
  return run;
}

absl::Status Invalid(ArchiveKind kind, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(kind == ArchiveKind::kTorchSave
                                                     ? "not a torch.save file torchlens reads"
                                                     : "not a valid TorchScript archive",
                                                 ": ", why));
}

}  // namespace

bool InCodeFolder(absl::string_view name) { return absl::StartsWithIgnoreCase(name, "code/"); }

ScriptRecord ScriptRecordKind(absl::string_view name) {
  if (absl::EqualsIgnoreCase(name, "constants.pkl")) return ScriptRecord::kConstants;
  if (!InCodeFolder(name)) return ScriptRecord::kOther;
  if (absl::EndsWithIgnoreCase(name, ".py")) return ScriptRecord::kCode;
  if (absl::EndsWithIgnoreCase(name, ".debug_pkl")) return ScriptRecord::kDebugInfo;
  return ScriptRecord::kOther;
}

absl::StatusOr<CheckedArchive> CheckTorchArchive(absl::string_view bytes, ArchiveKind kind) {
  absl::StatusOr<ZipArchive> zip = ZipArchive::Open(bytes);
  if (!zip.ok() && !bytes.empty() && bytes[0] == '\x80') {
    // A pickle's PROTO opcode: the legacy torch.save format or a bare pickle, not a
    // damaged zip.
    return Invalid(kind,
                   "it is a bare pickle, not a zip archive: torch.save's legacy format "
                   "(_use_new_zipfile_serialization=False) or pickle.dump, which LibTorch "
                   "does not read. Save it again with torch.save's default format");
  }
  if (!zip.ok()) return Invalid(kind, zip.status().message());
  const bool script = kind == ArchiveKind::kTorchScript;
  const ZipArchive::Entry* data = zip->Find("data.pkl");
  if (data == nullptr) {
    return Invalid(kind, absl::StrCat("no record ", absl::CHexEscape(zip->prefix()), "data.pkl"));
  }
  if (script && std::none_of(zip->entries().begin(), zip->entries().end(),
                             [&](const ZipArchive::Entry& entry) {
                               absl::string_view name = entry.name;
                               return absl::ConsumePrefix(&name, zip->prefix()) &&
                                      InCodeFolder(name);
                             })) {
    // Said before data.pkl is read: a torch.save file's pickle (a state dict's
    // OrderedDict) uses what LibTorch's TorchScript unpickler does not read, and that
    // message would hide the cause.
    return Invalid(kind, "it holds no code (data saved with torch.save, not a module?)");
  }
  // TorchScript archives hold module objects, and LibTorch's unpickler reads them.
  const PickleOptions options{/*allow_objects=*/script, /*libtorch_dialect=*/script,
                              script ? kMaxModelArchiveNesting : kMaxPickleNesting};
  absl::StatusOr<RunPickleRecord> run = CheckPickleRecord(*zip, *data, "data/", options);
  if (!run.ok()) return Invalid(kind, run.status().message());
  if (script) {
    // The other pickles torch::jit::load runs: the tensor constants of the code, and the
    // debug information behind the source lines of error messages.
    for (const ZipArchive::Entry& entry : zip->entries()) {
      absl::string_view name = entry.name;
      if (!absl::ConsumePrefix(&name, zip->prefix())) continue;
      const ScriptRecord record = ScriptRecordKind(name);
      const bool constants = record == ScriptRecord::kConstants;
      if (!constants && record != ScriptRecord::kDebugInfo) continue;
      absl::StatusOr<RunPickleRecord> other =
          CheckPickleRecord(*zip, entry, constants ? "constants/" : "", options);
      if (!other.ok()) return Invalid(kind, other.status().message());
      if (!constants) {  // NOTE [Debug information]
        if (absl::Status s = DebugInfoCheck(other->values).Run(); !s.ok()) {
          return Invalid(kind, absl::StrCat(absl::CHexEscape(entry.name), ": ", s.message()));
        }
      }
    }
    // See NOTE [Untrusted archives] in zip_archive.h.
    for (const ZipArchive::Entry& entry : zip->entries()) {
      if (absl::Status crc = zip->CheckCrc(entry); !crc.ok()) return Invalid(kind, crc.message());
    }
    // LibTorch reads the format version first, from ".data/version" or "version", and
    // throws from its reader's constructor (leaking the reader) when it is missing or not
    // a number it supports (1 to 10 in LibTorch 1.13).
    const ZipArchive::Entry* version = zip->Find(".data/version");
    if (version == nullptr) version = zip->Find("version");
    if (version == nullptr) {
      return Invalid(kind, absl::StrCat("no record ", absl::CHexEscape(zip->prefix()),
                                        "version (the archive's format version)"));
    }
    absl::StatusOr<std::string> text = zip->Read(*version);
    if (!text.ok()) return Invalid(kind, text.status().message());
    int64_t number = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &number) || number < 1 ||
        number > 10) {
      return Invalid(kind, absl::StrCat("record ", absl::CHexEscape(version->name), " holds \"",
                                        absl::CHexEscape(text->substr(0, 16)),
                                        "\", not a format version LibTorch 1.13 reads (1 to 10)"));
    }
  }
  CheckedArchive checked{*std::move(zip), std::move(run->values), std::move(run->storage_records),
                         std::move(run->tensor_names)};
  return checked;
}

}  // namespace torchlens
