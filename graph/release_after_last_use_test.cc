// ReleaseAfterLastUse gives back a window of the file once every storage that overlaps it
// has had its last reader (NOTE [Releasing after the last use]): storages that share a
// window keep it until the last of them is done, in whatever order the steps finish.
#include "graph/release_after_last_use.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/mapped_storage.h"
#include "graph/mapping_resident.h"
#include "gtest/gtest.h"

namespace torchlens {
namespace {

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kFileBytes = 16 * kMiB;  // 8 windows
static_assert(kReleaseWindow == 2 * kMiB, "the windows below are 2 MiB");

// A file of kFileBytes mapped as the trace reader maps one read on use (privately and
// writable, so that the kernel honours the advice), with each byte its offset mod 251.
class MappedFile {
 public:
  MappedFile() {
    const std::string path = absl::StrCat(::testing::TempDir(), "/release_after_last_use.bin");
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    EXPECT_GE(fd, 0);
    std::vector<char> bytes(kFileBytes);
    for (size_t i = 0; i < kFileBytes; ++i) bytes[i] = static_cast<char>(i % 251);
    EXPECT_EQ(::write(fd, bytes.data(), kFileBytes), static_cast<ssize_t>(kFileBytes));
    EXPECT_EQ(::fsync(fd), 0);
    void* data = ::mmap(nullptr, kFileBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    ::close(fd);
    EXPECT_NE(data, MAP_FAILED);
    data_ = static_cast<char*>(data);
  }
  ~MappedFile() { ::munmap(data_, kFileBytes); }

  // A uint8 tensor over [begin, end) MiB of the file, its storage made over the mapping.
  at::Tensor Range(double begin_mib, double end_mib) {
    const auto begin = static_cast<size_t>(begin_mib * kMiB);
    const auto bytes = static_cast<size_t>(end_mib * kMiB) - begin;
    at::Storage storage =
        StorageOverMapping(data_ + begin, bytes, absl::string_view(data_, kFileBytes), nullptr);
    return at::empty({0}, at::kByte).set_(storage, 0, {static_cast<int64_t>(bytes)}, {1});
  }

  int64_t ResidentMiB() const { return ResidentBytesOfMappingAt(data_) / kMiB; }

 private:
  char* data_ = nullptr;
};

TEST(ReleaseAfterLastUseTest, GivesBackAWindowWhenEveryStorageOverlappingItIsDone) {
  MappedFile file;
  // Windows (2 MiB each): s0 lies in 0; s1 in 0 and 1; s2 in 1, 2 and 3; s3 in 3; s4 in 4
  // to 7.
  const std::vector<at::Tensor> s = {file.Range(0, 1.5), file.Range(1.5, 2.5), file.Range(2.5, 6.5),
                                     file.Range(6.5, 8), file.Range(8, 16)};
  const at::Tensor in_memory = at::ones({4});  // not mapped: never counted
  const std::vector<std::vector<at::Tensor>> reads = {
      {s[0], s[1], in_memory}, {s[1], s[2], s[1]}, {s[3], s[4]}, {s[2]}};
  ReleaseAfterLastUse pages(reads.size(), [&](size_t step, const TensorVisitor& visit) {
    for (const at::Tensor& t : reads[step]) visit(t);
  });
  int64_t sum = 0;
  for (const at::Tensor& t : s) sum += t.sum().item<int64_t>();  // every page read in
  ASSERT_EQ(file.ResidentMiB(), 16);

  pages.Done(0);  // s0 done; window 0 still has s1 to read
  EXPECT_EQ(file.ResidentMiB(), 16);
  pages.Done(2);  // s3 and s4 done: windows 4 to 7 go; window 3 waits for s2
  EXPECT_EQ(file.ResidentMiB(), 8);
  pages.Done(1);  // s1 done: window 0 goes; windows 1 to 3 wait for s2
  EXPECT_EQ(file.ResidentMiB(), 6);
  pages.Done(3);  // s2 done: windows 1 to 3 go
  EXPECT_EQ(file.ResidentMiB(), 0);

  // Given back, not lost: read again from the file.
  int64_t again = 0;
  for (const at::Tensor& t : s) again += t.sum().item<int64_t>();
  EXPECT_EQ(again, sum);
  EXPECT_EQ(s[4][5].item<uint8_t>(), (8 * kMiB + 5) % 251);
}

TEST(ReleaseAfterLastUseTest, KeepsAWindowAStorageStillToBeReadShares) {
  MappedFile file;
  // Two storages in window 0, read by different steps; the second step never finishes.
  const at::Tensor a = file.Range(0, 1);
  const at::Tensor b = file.Range(1, 2);
  ReleaseAfterLastUse pages(
      2, [&](size_t step, const TensorVisitor& visit) { visit(step == 0 ? a : b); });
  EXPECT_GT(a.sum().item<int64_t>() + b.sum().item<int64_t>(), 0);
  pages.Done(0);
  EXPECT_EQ(file.ResidentMiB(), 2);
}

TEST(ReleaseAfterLastUseTest, TensorsInMemoryCostNothing) {
  const at::Tensor t = at::arange(10);
  ReleaseAfterLastUse pages(3, [&](size_t, const TensorVisitor& visit) { visit(t); });
  for (size_t step = 0; step < 3; ++step) pages.Done(step);
  EXPECT_EQ(t.sum().item<int64_t>(), 45);  // untouched
}

}  // namespace
}  // namespace torchlens
