#include "graph/archive_check.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"

namespace torchlens {
namespace {

using Kind = PickleNode::Kind;

// Names the tensors of a run pickle by where they sit, and refuses values that contain
// themselves or nest deeper than kMaxPickleNesting: LibTorch walks loaded values
// recursively (restoring type tags, freeing), which a cycle or a deep chain overflows.
// Depths recorded while the program ran can be stale (a list filled after it was put in
// another), so the walk counts its own.
class TensorNamer {
 public:
  explicit TensorNamer(const PickleValues& values)
      : values_(values), state_(values.nodes.size(), kUnvisited) {}

  absl::Status Walk(std::vector<std::string>* names) {
    names_.assign(values_.tensors.size(), "(unreachable)");
    std::string path;
    if (absl::Status s = Visit(values_.root, &path, 0); !s.ok()) return s;
    *names = std::move(names_);
    return absl::OkStatus();
  }

 private:
  enum State : uint8_t { kUnvisited, kVisiting, kDone };

  absl::Status Child(uint32_t id, std::string* path, absl::string_view step, uint32_t depth) {
    const size_t length = path->size();
    path->append(step.data(), step.size());
    absl::Status s = Visit(id, path, depth + 1);
    path->resize(length);
    return s;
  }

  absl::Status Visit(uint32_t id, std::string* path, uint32_t depth) {
    if (depth > kMaxPickleNesting) {
      return absl::InvalidArgumentError(
          absl::StrCat("values nest deeper than ", kMaxPickleNesting, " levels"));
    }
    if (state_[id] == kVisiting) {
      return absl::InvalidArgumentError(
          absl::StrCat("the value at '", *path, "' contains itself"));
    }
    if (state_[id] == kDone) return absl::OkStatus();  // shared: named where first seen
    state_[id] = kVisiting;
    const PickleNode& node = values_.nodes[id];
    absl::Status s;
    switch (node.kind) {
      case Kind::kTensor:
        names_[node.index] = *path;
        break;
      case Kind::kTuple:
      case Kind::kList:
        for (size_t i = 0; i < node.items.size() && s.ok(); ++i) {
          s = Child(node.items[i], path, absl::StrCat("[", i, "]"), depth);
        }
        break;
      case Kind::kDict:
        for (size_t i = 0; i + 1 < node.items.size() && s.ok(); i += 2) {
          const PickleNode& key = values_.nodes[node.items[i]];
          s = Child(node.items[i], path, "(a key)", depth);
          if (!s.ok()) break;
          s = Child(node.items[i + 1], path,
                    key.kind == Kind::kString ? absl::StrCat("['", absl::CHexEscape(key.text), "']")
                    : key.kind == Kind::kInt  ? absl::StrCat("[", key.int_value, "]")
                                              : std::string("[?]"),
                    depth);
        }
        break;
      case Kind::kObject:
        s = Child(node.items[1], path, "(arguments)", depth);
        if (s.ok() && node.state != kNoNode) s = VisitState(node.state, path, depth);
        break;
      default:
        break;
    }
    state_[id] = kDone;
    return s;
  }

  // An object's state: a dict of attributes ("stem.weight"), or anything else.
  absl::Status VisitState(uint32_t id, std::string* path, uint32_t depth) {
    const PickleNode& state = values_.nodes[id];
    if (state.kind != Kind::kDict || state_[id] != kUnvisited) return Child(id, path, "", depth);
    state_[id] = kVisiting;
    absl::Status s;
    for (size_t i = 0; i + 1 < state.items.size() && s.ok(); i += 2) {
      const PickleNode& key = values_.nodes[state.items[i]];
      s = Child(state.items[i], path, "(a key)", depth);
      if (!s.ok()) break;
      const std::string attribute =
          key.kind == Kind::kString ? absl::CHexEscape(key.text) : std::string("?");
      s = Child(state.items[i + 1], path, path->empty() ? attribute : absl::StrCat(".", attribute),
                depth);
    }
    state_[id] = kDone;
    return s;
  }

  const PickleValues& values_;
  std::vector<State> state_;
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
      return absl::InvalidArgumentError(absl::StrCat(
          "storage ", absl::CHexEscape(record), of, " claims ", storage.numel, " ", storage.dtype,
          " elements (", bytes > UINT64_MAX ? std::string("2^64 or more")
                                            : absl::StrCat(static_cast<uint64_t>(bytes)),
          " bytes), but its record holds ", entry->size, " bytes (truncated?)"));
    }
    records->push_back(*entry);
  }
  for (size_t t = 0; t < values.tensors.size(); ++t) {
    const PickledTensor& tensor = values.tensors[t];
    const PickledStorage& storage = values.storages[tensor.storage];
    const std::string shape =
        absl::StrCat(storage.dtype, ", sizes [", absl::StrJoin(tensor.sizes, ", "),
                     "], strides [", absl::StrJoin(tensor.strides, ", "), "], offset ",
                     tensor.offset);
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
      return absl::InvalidArgumentError(absl::StrCat(
          TensorName(names[t]), " (", shape, ") has a negative size, stride or offset"));
    }
    absl::uint128 numel = 1;
    for (int64_t size : tensor.sizes) {
      numel *= static_cast<uint64_t>(size);
      if (numel > INT64_MAX) {
        return absl::InvalidArgumentError(absl::StrCat(
            TensorName(names[t]), " (", shape, ") has more than 2^63 - 1 elements"));
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
          last > UINT64_MAX ? std::string("2^64 or beyond") : absl::StrCat(static_cast<uint64_t>(last)),
          " of its storage ", absl::CHexEscape(absl::StrCat(record_directory, storage.key)),
          ", which holds ", storage.numel, " elements"));
    }
  }
  return absl::OkStatus();
}

struct RunPickleRecord {
  PickleValues values;
  std::vector<std::string> tensor_names;
  std::vector<ZipArchive::Entry> storage_records;
};

// Runs one pickle record and checks what it holds.
absl::StatusOr<RunPickleRecord> CheckPickleRecord(const ZipArchive& zip,
                                                  const ZipArchive::Entry& entry,
                                                  absl::string_view record_directory,
                                                  bool allow_objects) {
  const std::string where = absl::CHexEscape(entry.name);
  absl::StatusOr<std::string> program = zip.Read(entry);
  if (!program.ok()) return program.status();
  absl::StatusOr<PickleValues> values = RunPickle(*program, PickleOptions{allow_objects});
  if (!values.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", values.status().message()));
  }
  RunPickleRecord run;
  run.values = *std::move(values);
  if (absl::Status s = TensorNamer(run.values).Walk(&run.tensor_names); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", s.message()));
  }
  if (absl::Status s = CheckTensors(run.values, run.tensor_names, zip, record_directory,
                                    &run.storage_records);
      !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", s.message()));
  }
  return run;
}

absl::Status Invalid(ArchiveKind kind, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(
      kind == ArchiveKind::kTorchSave ? "not a torch.save file torchlens reads"
                                      : "not a valid TorchScript archive",
      ": ", why));
}

}  // namespace

absl::StatusOr<CheckedArchive> CheckTorchArchive(absl::string_view bytes, ArchiveKind kind) {
  absl::StatusOr<ZipArchive> zip = ZipArchive::Open(bytes);
  if (!zip.ok()) return Invalid(kind, zip.status().message());
  const bool script = kind == ArchiveKind::kTorchScript;
  const ZipArchive::Entry* data = zip->Find("data.pkl");
  if (data == nullptr) {
    return Invalid(kind, absl::StrCat("no record ", absl::CHexEscape(zip->prefix()), "data.pkl"));
  }
  absl::StatusOr<RunPickleRecord> run = CheckPickleRecord(*zip, *data, "data/", script);
  if (!run.ok()) return Invalid(kind, run.status().message());
  if (script) {
    // The other pickles torch::jit::load runs: the tensor constants of the code, and the
    // debug information behind the source lines of error messages.
    bool has_code = false;
    for (const ZipArchive::Entry& entry : zip->entries()) {
      absl::string_view name = entry.name;
      if (!absl::ConsumePrefix(&name, zip->prefix())) continue;
      has_code = has_code || absl::StartsWith(name, "code/");
      const bool constants = name == "constants.pkl";
      if (!constants && !(absl::StartsWith(name, "code/") && absl::EndsWith(name, ".debug_pkl"))) {
        continue;
      }
      absl::StatusOr<RunPickleRecord> other =
          CheckPickleRecord(*zip, entry, constants ? "constants/" : "", /*allow_objects=*/true);
      if (!other.ok()) return Invalid(kind, other.status().message());
      if (!constants && !other->values.storages.empty()) {
        return Invalid(kind, absl::StrCat(absl::CHexEscape(entry.name), ": tensors in debug information"));
      }
    }
    if (!has_code) {
      return Invalid(kind, "it holds no code (data saved with torch.save, not a module?)");
    }
  }
  CheckedArchive checked{*std::move(zip), std::move(run->values), std::move(run->storage_records),
                         std::move(run->tensor_names)};
  return checked;
}

}  // namespace torchlens
