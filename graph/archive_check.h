// Checking untrusted `torch.save` and `torch.jit.save` bytes before anything reads them.
//
//   absl::StatusOr<CheckedArchive> checked =
//       CheckTorchArchive(bytes, ArchiveKind::kTorchScript);
//   if (!checked.ok()) return checked.status();   // names what is wrong and where
//   // LibTorch may now load `bytes`.
//
// A check covers, in order:
//   * the zip container (zip_archive.h, NOTE [Untrusted archives]);
//   * every pickle program LibTorch would run: `data.pkl`, and for TorchScript archives
//     `constants.pkl` and the debug information `code/**.debug_pkl` that error messages
//     read (pickle_values.h, NOTE [Pickle stack depth]);
//   * every storage against its record, and every tensor against its storage (NOTE
//     [Pickled tensors]): a storage's `numel * itemsize` bytes must lie in its record, a
//     tensor's `offset + sum((size_i - 1) * stride_i) + 1` elements in its storage, with
//     no negative size, stride or offset and at most 2^63 - 1 elements. Errors name the
//     tensor by where it sits: `stem.weight` (a module attribute), `[1]` (a list or
//     tuple element), `['x']` (a dict entry).
#ifndef TORCHLENS_GRAPH_ARCHIVE_CHECK_H_
#define TORCHLENS_GRAPH_ARCHIVE_CHECK_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "graph/pickle_values.h"
#include "graph/zip_archive.h"

namespace torchlens {

enum class ArchiveKind {
  kTorchSave,    // `torch.save` data: tensors, lists, tuples, dicts (no objects)
  kTorchScript,  // `torch.jit.save` modules: objects of the archive's own classes
};

struct CheckedArchive {
  ZipArchive zip;
  PickleValues data;  // data.pkl, run
  // The record of each of data's storages (by PickleValues::storages index), checked to
  // hold its `numel * item_size` bytes.
  std::vector<ZipArchive::Entry> storage_records;
  // Each of data's tensors by where it sits (by PickleValues::tensors index): "stem.weight",
  // "[0]"; "" for the root itself; "(unreachable)" for one the root does not hold.
  std::vector<std::string> tensor_names;
};

// kInvalidArgument "not a torch.save file torchlens reads: ..." (or "not a valid
// TorchScript archive: ...") naming what is wrong. `bytes` must outlive the result.
absl::StatusOr<CheckedArchive> CheckTorchArchive(absl::string_view bytes, ArchiveKind kind);

// The records of a TorchScript archive that LibTorch reads as more than bytes: the code it
// compiles, the debug information its error messages unpickle and the constants pickle.
enum class ScriptRecord {
  kOther,
  kCode,       // code/**.py
  kDebugInfo,  // code/**.debug_pkl
  kConstants,  // constants.pkl
};

// What `name`, a record's name inside the archive's folder, is to LibTorch. Its reader
// finds records without regard to case ("coDe/__torch__.PY" is read as
// "code/__torch__.py"), so every check selects them the same way.
ScriptRecord ScriptRecordKind(absl::string_view name);

// Whether `name` lies in the code folder (without regard to case, as ScriptRecordKind).
bool InCodeFolder(absl::string_view name);

}  // namespace torchlens

#endif  // TORCHLENS_GRAPH_ARCHIVE_CHECK_H_
