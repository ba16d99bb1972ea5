#include "graph/file_io.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace torchlens {
namespace {

std::string Named(FileRole role, const std::string& path) {
  return absl::StrCat(role.what, " '", path, "'");
}

// What a non-regular file is, for the refusal.
const char* KindOf(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// Closes the descriptor on every return path.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

absl::Status ReadError(FileRole role, const std::string& path) {
  return absl::ErrnoToStatus(errno, absl::StrCat("cannot read ", Named(role, path)));
}

// See NOTE [Files that are not regular files].
absl::StatusOr<std::string> ReadStream(int fd, FileRole role, const std::string& path,
                                       const ReadLimits& limits) {
  std::string bytes;
  char chunk[1 << 16];
  const int timeout_ms = static_cast<int>(absl::ToInt64Milliseconds(limits.idle_timeout));
  while (true) {
    pollfd ready{fd, POLLIN, 0};
    const int polled = ::poll(&ready, 1, timeout_ms);
    if (polled < 0 && errno == EINTR) continue;
    if (polled < 0) return ReadError(role, path);
    if (polled == 0) {
      return absl::DeadlineExceededError(
          absl::StrCat(Named(role, path), " is a pipe or FIFO and ",
                       bytes.empty() ? "no writer sent anything" : "its writer stopped sending",
                       " for ", absl::FormatDuration(limits.idle_timeout),
                       "; start the writer first, or save it to a regular file"));
    }
    const ssize_t n = ::read(fd, chunk, sizeof(chunk));
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n < 0) return ReadError(role, path);
    if (n == 0) break;
    if (bytes.size() + static_cast<uint64_t>(n) > limits.max_stream_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          Named(role, path), " is a pipe or FIFO longer than ", limits.max_stream_bytes,
          " bytes, the most torchlens reads from a stream; save it to a regular file"));
    }
    bytes.append(chunk, static_cast<size_t>(n));
  }
  return bytes;
}

}  // namespace

FileBytes& FileBytes::operator=(FileBytes&& other) noexcept {
  if (this != &other) {
    if (mapping_ != nullptr) ::munmap(mapping_, length_);
    mapping_ = std::exchange(other.mapping_, nullptr);
    length_ = std::exchange(other.length_, 0);
    held_ = std::move(other.held_);
  }
  return *this;
}

FileBytes::~FileBytes() {
  if (mapping_ != nullptr) ::munmap(mapping_, length_);
}

// See FileBytes and ReadLimits::page_on_use.
absl::StatusOr<FileBytes> FileBytes::Map(int fd, uint64_t size, bool page_on_use) {
  void* mapping = page_on_use ? ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0)
                              : ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
  if (mapping == MAP_FAILED) return absl::ErrnoToStatus(errno, "cannot map the file");
  FileBytes bytes;
  bytes.mapping_ = mapping;
  bytes.length_ = size;
  return bytes;
}

absl::StatusOr<FileBytes> ReadFileBytes(const std::string& path, FileRole role,
                                        const ReadLimits& limits) {
  // Look before opening: opening a device can have effects, opening a FIFO blocks.
  struct stat info;
  if (::stat(path.c_str(), &info) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) {
      return absl::NotFoundError(absl::StrCat(Named(role, path), " does not exist"));
    }
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot access ", Named(role, path)));
  }
  if (!S_ISREG(info.st_mode) && !S_ISFIFO(info.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(Named(role, path), " is ", KindOf(info.st_mode),
                                                   "; expected ", role.expected));
  }
  // O_NONBLOCK: opening a FIFO without a writer returns at once (ReadStream then waits
  // for one with a bound). Regular files ignore it.
  const Fd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (fd.get() < 0) {
    if (errno == EACCES || errno == EPERM) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot read ", Named(role, path), ": ", std::strerror(errno)));
    }
    return ReadError(role, path);
  }
  if (::fstat(fd.get(), &info) != 0) return ReadError(role, path);
  const bool regular = S_ISREG(info.st_mode);
  if (!regular && !S_ISFIFO(info.st_mode)) {  // replaced between stat and open
    return absl::InvalidArgumentError(absl::StrCat(Named(role, path), " is ", KindOf(info.st_mode),
                                                   "; expected ", role.expected));
  }
  if (regular && info.st_size == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(Named(role, path), " is empty (0 bytes); expected ", role.expected));
  }
  if (regular) {
    absl::StatusOr<FileBytes> mapped =
        FileBytes::Map(fd.get(), static_cast<uint64_t>(info.st_size), limits.page_on_use);
    if (!mapped.ok()) {
      return absl::Status(mapped.status().code(), absl::StrCat("cannot read ", Named(role, path),
                                                               ": ", mapped.status().message()));
    }
    return mapped;
  }
  absl::StatusOr<std::string> streamed = ReadStream(fd.get(), role, path, limits);
  if (!streamed.ok()) return streamed.status();
  if (streamed->empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Named(role, path), " delivered no bytes; expected ", role.expected));
  }
  return FileBytes(*std::move(streamed));
}

absl::Status WriteFileBytes(const std::string& path, absl::string_view bytes,
                            absl::string_view what) {
  const std::string named = absl::StrCat(what, " '", path, "'");
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) return absl::ErrnoToStatus(errno, absl::StrCat("cannot create ", named));
  // Buffered writes can fail at any step up to the close (a full disk reports at flush).
  const bool written =
      std::fwrite(bytes.data(), 1, bytes.size(), file) == bytes.size() && std::fflush(file) == 0;
  const int write_errno = errno;
  const bool closed = std::fclose(file) == 0;
  if (!written || !closed) {
    return absl::ErrnoToStatus(written ? errno : write_errno, absl::StrCat("cannot write ", named));
  }
  return absl::OkStatus();
}

}  // namespace torchlens
