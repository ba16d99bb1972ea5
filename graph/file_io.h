// Reading and writing the files torchlens is given, with errors that name the file, what
// was expected of it, and the cause.
//
//   absl::StatusOr<FileBytes> bytes =
//       torchlens::ReadFileBytes(path, {"model file", "a TorchScript archive"});
//   if (!bytes.ok()) return bytes.status();
//   Parse(bytes->view());
//   absl::Status written = torchlens::WriteFileBytes(path, json, "JSON file");
//
// NOTE [Files that are not regular files]
// A path may name something that is not a file on disk. Reading one naively either never
// ends (`/dev/zero`, `/dev/urandom`), blocks forever (a FIFO that nobody writes to: even
// opening it blocks), or has side effects (opening some devices). ReadFileBytes therefore
// reads exactly two kinds of things:
//   * regular files, all of them (their size is known before reading);
//   * pipes and FIFOs (`--model <(cat m.pt)`, `/dev/stdin` when piped, `mkfifo`), up to
//     `ReadLimits::max_stream_bytes`, waiting at most `ReadLimits::idle_timeout` for a
//     writer to connect and for each next chunk.
// Everything else (directories, character and block devices, sockets) is refused without
// being opened or read, naming what it is.
//
// A regular file is mapped privately and read-only, with its pages read in at once: a
// 790 MB model loads in the time LibTorch's own reader takes, where copying it into a
// new buffer first made loading take twice as long (README "Reliability"). As with any
// mapped file, truncating the file while it is mapped ends the process with SIGBUS.
#ifndef TORCHLENS_GRAPH_FILE_IO_H_
#define TORCHLENS_GRAPH_FILE_IO_H_

#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace torchlens {

// What a file is for, as error messages name it: "model file", and "a TorchScript
// archive saved with torch.jit.save".
struct FileRole {
  absl::string_view what;
  absl::string_view expected;
};

// Bounds on reading a pipe or FIFO (NOTE [Files that are not regular files]), and how a
// regular file is mapped.
struct ReadLimits {
  uint64_t max_stream_bytes = uint64_t{1} << 30;
  absl::Duration idle_timeout = absl::Seconds(10);
  // A regular file is mapped without reading its pages in: each is read on first use.
  // The mapping is then writable, copy-on-write (a write changes this process's copy of the
  // page, never the file), so that tensors made over it are ordinary writable tensors.
  bool page_on_use = false;
};

// The content of a file: a private read-only mapping of a regular file, or the bytes
// read from a pipe. Movable, not copyable; `view()` lives as long as the object.
class FileBytes {
 public:
  FileBytes() = default;
  explicit FileBytes(std::string bytes) : held_(std::move(bytes)) {}
  FileBytes(FileBytes&& other) noexcept { *this = std::move(other); }
  FileBytes& operator=(FileBytes&& other) noexcept;
  FileBytes(const FileBytes&) = delete;
  FileBytes& operator=(const FileBytes&) = delete;
  ~FileBytes();

  absl::string_view view() const {
    return mapping_ != nullptr ? absl::string_view(static_cast<const char*>(mapping_), length_)
                               : absl::string_view(held_);
  }

 private:
  friend absl::StatusOr<FileBytes> ReadFileBytes(const std::string&, FileRole, const ReadLimits&);
  // The whole regular file `fd` of `size` bytes, mapped.
  static absl::StatusOr<FileBytes> Map(int fd, uint64_t size, bool page_on_use);

  void* mapping_ = nullptr;
  size_t length_ = 0;
  std::string held_;
};

// The whole content of `path`. Errors (each message names the path and the role):
// kNotFound: no such file. kPermissionDenied: not readable. kInvalidArgument: a
// directory, a device or socket, or an empty file or stream. kResourceExhausted: a
// stream longer than `max_stream_bytes`. kDeadlineExceeded: a pipe or FIFO that stayed
// silent (no writer, or no data) for `idle_timeout`. Other read errors keep their errno's
// code.
absl::StatusOr<FileBytes> ReadFileBytes(const std::string& path, FileRole role,
                                        const ReadLimits& limits = {});

// Writes `bytes` to `path` (created or truncated) and closes it, checking every step: a
// full disk (or `/dev/full`) is kResourceExhausted, a missing directory kNotFound, no
// permission kPermissionDenied; messages name `what` ("--json file") and the path.
absl::Status WriteFileBytes(const std::string& path, absl::string_view bytes,
                            absl::string_view what);

}  // namespace torchlens

#endif  // TORCHLENS_GRAPH_FILE_IO_H_
