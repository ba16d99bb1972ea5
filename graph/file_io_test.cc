#include "graph/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace torchlens {
namespace {

using ::testing::HasSubstr;

constexpr FileRole kRole = {"model file", "a TorchScript archive"};

std::string Temp(const std::string& name) { return absl::StrCat(testing::TempDir(), "/", name); }

void Write(const std::string& path, const std::string& bytes) {
  std::FILE* file = std::fopen(path.c_str(), "wb");
  ASSERT_NE(file, nullptr);
  std::fwrite(bytes.data(), 1, bytes.size(), file);
  std::fclose(file);
}

TEST(ReadFileBytesTest, RegularFile) {
  const std::string bytes("PK\0\1binary", 10);
  Write(Temp("model.pt"), bytes);
  absl::StatusOr<FileBytes> read = ReadFileBytes(Temp("model.pt"), kRole);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->view(), bytes);
}

TEST(ReadFileBytesTest, MissingEmptyAndDirectoryNameThePathAndTheRole) {
  absl::StatusOr<FileBytes> missing = ReadFileBytes(Temp("missing.pt"), kRole);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()),
              HasSubstr("model file '" + Temp("missing.pt") + "' does not exist"));

  Write(Temp("empty.pt"), "");
  absl::StatusOr<FileBytes> empty = ReadFileBytes(Temp("empty.pt"), kRole);
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(empty.status().message()),
              HasSubstr("is empty (0 bytes); expected a TorchScript archive"));

  absl::StatusOr<FileBytes> directory = ReadFileBytes(testing::TempDir(), kRole);
  EXPECT_EQ(directory.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(directory.status().message()),
              HasSubstr("'" + testing::TempDir() + "' is a directory"));
}

// /dev/zero used to be read until memory ran out.
TEST(ReadFileBytesTest, DevicesAreRefusedWithoutReading) {
  for (const char* device : {"/dev/zero", "/dev/null", "/dev/urandom"}) {
    absl::StatusOr<FileBytes> read = ReadFileBytes(device, kRole);
    EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument) << device;
    EXPECT_THAT(std::string(read.status().message()), HasSubstr("is a character device")) << device;
  }
}

// What bash's process substitution `<(cat m.pt)` passes: /dev/fd/N, an anonymous pipe.
// It used to be "empty (0 bytes)": stat gives a pipe the size 0.
TEST(ReadFileBytesTest, AnonymousPipeIsReadToTheEnd) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const std::string bytes(200000, 'x');  // more than a pipe buffer: the writer blocks
  std::thread writer([&] {
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::write(fds[1], bytes.data() + done, bytes.size() - done);
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    ::close(fds[1]);
  });
  absl::StatusOr<FileBytes> read = ReadFileBytes(absl::StrCat("/dev/fd/", fds[0]), kRole);
  writer.join();
  ::close(fds[0]);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->view().size(), bytes.size());
  EXPECT_EQ(read->view(), bytes);
}

TEST(ReadFileBytesTest, FifoWithAWriterIsRead) {
  const std::string fifo = Temp("with_writer.fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::thread writer([&] {
    absl::SleepFor(absl::Milliseconds(50));  // the reader opens first and waits
    Write(fifo, "model bytes");
  });
  absl::StatusOr<FileBytes> read = ReadFileBytes(fifo, kRole);
  writer.join();
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->view(), "model bytes");
}

// A FIFO nobody writes to used to block forever (already in open()).
TEST(ReadFileBytesTest, FifoWithoutAWriterTimesOut) {
  const std::string fifo = Temp("no_writer.fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  ReadLimits limits;
  limits.idle_timeout = absl::Milliseconds(200);
  const absl::Time start = absl::Now();
  absl::StatusOr<FileBytes> read = ReadFileBytes(fifo, kRole, limits);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(read.status().message()),
              HasSubstr("is a pipe or FIFO and no writer sent anything for 200ms"));
}

TEST(ReadFileBytesTest, StreamsAreCapped) {
  std::signal(SIGPIPE, SIG_IGN);  // the writer learns of the refusal by EPIPE
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  std::thread writer([&] {
    const std::string chunk(4096, 'z');
    // Until the reader gives up and closes its end.
    while (::write(fds[1], chunk.data(), chunk.size()) > 0) {
    }
    ::close(fds[1]);
  });
  ReadLimits limits;
  limits.max_stream_bytes = 100000;
  absl::StatusOr<FileBytes> read =
      ReadFileBytes(absl::StrCat("/proc/self/fd/", fds[0]), kRole, limits);
  ::close(fds[0]);
  writer.join();
  EXPECT_EQ(read.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(read.status().message()), HasSubstr("longer than 100000 bytes"));
}

TEST(WriteFileBytesTest, WritesAndReportsEveryFailure) {
  ASSERT_TRUE(WriteFileBytes(Temp("out.json"), "{}\n", "JSON file").ok());
  absl::StatusOr<FileBytes> back = ReadFileBytes(Temp("out.json"), kRole);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->view(), "{}\n");

  // A full disk shows only when the buffer is flushed.
  const absl::Status full = WriteFileBytes("/dev/full", "x", "JSON file");
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(full.message()),
              HasSubstr("cannot write JSON file '/dev/full': No space left on device"));

  const absl::Status no_directory = WriteFileBytes(Temp("missing/out.json"), "x", "JSON file");
  EXPECT_EQ(no_directory.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(no_directory.message()), HasSubstr("missing/out.json"));
}

}  // namespace
}  // namespace torchlens
