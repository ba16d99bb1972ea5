// The buffer journal on its own: reads, writes of the whole buffer and through slices and
// permuted views, buffers sharing a storage, set_, fused writes, reassignments and
// unjournaled changes, with hand-made buffers and no dispatcher.
#include "torchlens_dispatch/buffer_journal.h"

#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace torchlens {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// The recorder's side: the producer of each tensor, and which tensor is which buffer's.
class FakeTensors : public BufferJournal::Tensors {
 public:
  SourceRecord SourceOf(const at::Tensor& tensor) override {
    SourceRecord source;
    auto it = producers_.find(tensor.unsafeGetTensorImpl());
    if (it == producers_.end()) return source;
    source.kind = SourceRecord::Kind::kNode;
    source.index = it->second;
    return source;
  }
  void SetBuffer(const at::Tensor& tensor, int32_t buffer) override {
    buffer_of[tensor.unsafeGetTensorImpl()] = buffer;
  }
  void SetFormerBuffer(const at::Tensor& tensor, int32_t buffer, int32_t version) override {
    buffer_of[tensor.unsafeGetTensorImpl()] = -1;
    former[tensor.unsafeGetTensorImpl()] = {buffer, version};
  }
  void Produced(const at::Tensor& tensor, int32_t node) {
    producers_[tensor.unsafeGetTensorImpl()] = node;
  }
  absl::flat_hash_map<const c10::TensorImpl*, int32_t> buffer_of;
  absl::flat_hash_map<const c10::TensorImpl*, std::pair<int32_t, int32_t>> former;

 private:
  absl::flat_hash_map<const c10::TensorImpl*, int32_t> producers_;
};

// A layout of C++-frontend buffers (read from `tensor`, as torch::nn layouts are).
std::unique_ptr<ModelLayout> Layout(
    const std::vector<std::pair<std::string, at::Tensor>>& buffers) {
  auto layout = std::make_unique<ModelLayout>();
  for (const auto& [address, tensor] : buffers) {
    ModelLayout::BufferEntry entry;
    entry.address = address;
    entry.tensor = tensor;
    layout->buffers.push_back(std::move(entry));
  }
  return layout;
}

// An op node whose call the test then plays by hand.
int32_t AddOp(RecordAppender* record) {
  NodeRecord node = record->BeginOp();
  record->EndArguments(&node, {});
  return record->AddOp(node);
}

const NodeRecord& Node(const RecordAppender& record, int32_t index) { return record.node(index); }

at::Tensor Value(RecordAppender* record, int32_t node) {
  return record->slot(record->OutputSlot(node));
}

struct Journal {
  explicit Journal(const std::vector<std::pair<std::string, at::Tensor>>& buffers)
      : layout(Layout(buffers)),
        record(/*saved_values=*/true, /*training=*/false),
        journal(*layout, &record, &tensors, /*save=*/true) {}
  std::unique_ptr<ModelLayout> layout;
  RecordAppender record;
  FakeTensors tensors;
  BufferJournal journal;
};

TEST(BufferJournalTest, ReadHasItsOwnCopyOfTheInitialValue) {
  const at::Tensor b = at::tensor({1.0f, 2.0f});
  Journal j({{"b", b}});
  EXPECT_EQ(j.tensors.buffer_of.at(b.unsafeGetTensorImpl()), 0);
  const int32_t read = j.journal.Read(0);
  EXPECT_EQ(j.journal.Read(0), read);  // one read version
  const NodeRecord& node = Node(j.record, read);
  EXPECT_EQ(node.kind, NodeRecord::Kind::kBufferVersion);
  EXPECT_FALSE(node.write_kind.has_value());
  const at::Tensor initial = j.record.record().buffers[0].initial_value;
  EXPECT_TRUE(at::equal(Value(&j.record, read), initial));
  EXPECT_NE(Value(&j.record, read).data_ptr(), initial.data_ptr());
  EXPECT_NE(initial.data_ptr(), b.data_ptr());
}

TEST(BufferJournalTest, WriteOfTheWholeBufferIsTheOutputThatReturnedIt) {
  const at::Tensor b = at::zeros({3});
  Journal j({{"b", b}});
  j.journal.NoteWrite(b, WriteKind::kInplace, /*written_tensor=*/0);
  const int32_t op = AddOp(&j.record);
  b.add_(2.0);
  j.journal.CommitWrites(op, {c10::IValue(b)});
  const int32_t version = j.journal.Read(0);
  const NodeRecord& node = Node(j.record, version);
  EXPECT_EQ(node.write_kind, WriteKind::kInplace);
  const SourceRecord& source = j.record.record().sources[node.sources_begin];
  EXPECT_EQ(source.index, op);
  EXPECT_EQ(source.output_index, 0);
  EXPECT_TRUE(at::equal(Value(&j.record, version), at::full({3}, 2.0f)));
  EXPECT_TRUE(j.journal.Finish(/*allow_unjournaled=*/false).ok());
  EXPECT_TRUE(at::equal(j.record.record().buffers[0].final_value, at::full({3}, 2.0f)));
}

TEST(BufferJournalTest, WritesThroughASliceAndATransposeAreAliasWrites) {
  const at::Tensor b = at::zeros({2, 2});
  Journal j({{"b", b}});
  // b[0].fill_(1): the version's earlier state is the read, the geometry the slice's.
  const at::Tensor row = b.select(0, 0);
  j.journal.NoteWrite(row, WriteKind::kInplace, 0);
  const int32_t fill = AddOp(&j.record);
  row.fill_(1.0);
  j.journal.CommitWrites(fill, {c10::IValue(row)});
  const int32_t first = j.journal.Read(0);
  const SourceRecord& source = j.record.record().sources[Node(j.record, first).sources_begin];
  EXPECT_EQ(source.output_index, -1);
  const AliasWriteRecord& write =
      j.record.record().alias_writes[Node(j.record, fill).alias_writes_begin];
  EXPECT_EQ(Node(j.record, write.before.index).kind, NodeRecord::Kind::kBufferVersion);
  EXPECT_FALSE(Node(j.record, write.before.index).write_kind.has_value());
  EXPECT_THAT(write.written.sizes, ElementsAre(2));
  EXPECT_THAT(write.aliased.sizes, ElementsAre(2, 2));
  EXPECT_EQ(write.slot, j.record.OutputSlot(first));
  // b.t().copy_(x): the whole buffer, but permuted: an alias write too.
  const at::Tensor transposed = b.t();
  j.journal.NoteWrite(transposed, WriteKind::kInplace, 0);
  const int32_t copy = AddOp(&j.record);
  transposed.copy_(at::tensor({1.0f, 2.0f, 3.0f, 4.0f}).reshape({2, 2}));
  j.journal.CommitWrites(copy, {c10::IValue(transposed)});
  const int32_t second = j.journal.Read(0);
  EXPECT_EQ(j.record.record().sources[Node(j.record, second).sources_begin].output_index, -1);
  EXPECT_TRUE(
      at::equal(Value(&j.record, second), at::tensor({1.0f, 3.0f, 2.0f, 4.0f}).reshape({2, 2})));
}

TEST(BufferJournalTest, BuffersOnOneStorageAreWrittenByWhatOverlapsThem) {
  const at::Tensor b = at::zeros({4});
  const at::Tensor c = b.narrow(0, 0, 2);  // registered too: b's first half
  Journal j({{"b", b}, {"c", c}});
  EXPECT_THAT(*j.journal.BuffersIn(b.storage().unsafeGetStorageImpl()), ElementsAre(0, 1));
  // b[2:] does not touch c.
  j.journal.NoteWrite(b.narrow(0, 2, 2), WriteKind::kInplace, 0);
  const int32_t op = AddOp(&j.record);
  j.journal.CommitWrites(op, {});
  EXPECT_EQ(Node(j.record, j.journal.Read(0)).write_kind, WriteKind::kInplace);
  EXPECT_FALSE(Node(j.record, j.journal.Read(1)).write_kind.has_value());
  // A write through c is a version of both.
  j.journal.NoteWrite(c, WriteKind::kInplace, 0);
  const int32_t add = AddOp(&j.record);
  c.add_(1.0);
  j.journal.CommitWrites(add, {c10::IValue(c)});
  EXPECT_EQ(j.record.record().sources[Node(j.record, j.journal.Read(1)).sources_begin].output_index,
            0);  // c itself
  EXPECT_EQ(j.record.record().sources[Node(j.record, j.journal.Read(0)).sources_begin].output_index,
            -1);  // b, through its slice c
  EXPECT_EQ(j.journal.InPlaceOf(c.detach()), 1);
  EXPECT_EQ(j.journal.InPlaceOf(b.detach()), 0);
}

TEST(BufferJournalTest, SetMovesTheBufferToItsNewStorage) {
  const at::Tensor b = at::zeros({3});
  Journal j({{"b", b}});
  const at::Tensor other = at::full({3}, 5.0f);
  j.journal.NoteWrite(b, WriteKind::kInplace, 0);
  const int32_t set = AddOp(&j.record);
  b.set_(other);
  j.journal.CommitWrites(set, {c10::IValue(b)});
  EXPECT_NE(j.journal.BuffersIn(other.storage().unsafeGetStorageImpl()), nullptr);
  // A write to the new storage is a write of b.
  j.journal.NoteWrite(other, WriteKind::kInplace, 0);
  const int32_t add = AddOp(&j.record);
  other.add_(1.0);
  j.journal.CommitWrites(add, {c10::IValue(other)});
  EXPECT_TRUE(at::equal(Value(&j.record, j.journal.Read(0)), at::full({3}, 6.0f)));
  EXPECT_TRUE(j.journal.Finish(false).ok());
}

TEST(BufferJournalTest, FusedWriteSaysWhetherTheValueChanged) {
  const at::Tensor mean = at::zeros({2});
  Journal j({{"bn.running_mean", mean}});
  j.journal.NoteWrite(mean, WriteKind::kFused, -1);
  const int32_t op = AddOp(&j.record);
  j.journal.CommitWrites(op, {});
  EXPECT_EQ(Node(j.record, j.journal.Read(0)).value_changed, false);
  j.journal.NoteWrite(mean, WriteKind::kFused, -1);
  const int32_t second = AddOp(&j.record);
  mean.fill_(0.5);
  j.journal.CommitWrites(second, {});
  EXPECT_EQ(Node(j.record, j.journal.Read(0)).value_changed, true);
}

TEST(BufferJournalTest, ReassignmentIsAVersionProducedByTheNewTensorsProducer) {
  const at::Tensor h = at::zeros({2});
  Journal j({{"h", h}});
  j.layout->buffers[0].assigned_in_code = true;  // read by the journal's constructor
  BufferJournal journal(*j.layout, &j.record, &j.tensors, /*save=*/true);
  ASSERT_TRUE(journal.has_assigned_buffers());
  const int32_t tanh = AddOp(&j.record);
  const at::Tensor t = at::ones({2});
  j.record.AddOutput(tanh, t, -1);
  j.tensors.Produced(t, tanh);
  j.layout->buffers[0].tensor = t;  // self.h = t
  journal.CheckAssigned();
  const int32_t version = journal.Read(0);
  EXPECT_EQ(Node(j.record, version).write_kind, WriteKind::kReassign);
  EXPECT_EQ(j.record.record().sources[Node(j.record, version).sources_begin].index, tanh);
  EXPECT_EQ(j.tensors.buffer_of.at(h.unsafeGetTensorImpl()), -1);
  EXPECT_EQ(j.tensors.buffer_of.at(t.unsafeGetTensorImpl()), 0);
  EXPECT_EQ(j.record.record().stats.buffer_slot_reads, 1);
}

TEST(BufferJournalTest, UnjournaledChangeIsAnErrorOrADiagnostic) {
  const at::Tensor b = at::zeros({2});
  Journal j({{"block.b", b}});
  b.add_(1.0);  // behind the journal's back
  absl::Status status = j.journal.Finish(/*allow_unjournaled=*/false);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()), HasSubstr("\"block.b\""));
  EXPECT_THAT(std::string(status.message()), HasSubstr("self.b = t"));

  const at::Tensor nan = at::tensor({std::nanf(""), -0.0f});  // unchanged, bit for bit
  Journal quiet({{"n", nan}});
  EXPECT_TRUE(quiet.journal.Finish(false).ok());

  Journal allowed({{"b", b}});
  b.add_(1.0);
  EXPECT_TRUE(allowed.journal.Finish(/*allow_unjournaled=*/true).ok());
  ASSERT_EQ(allowed.record.record().diagnostics.size(), 1u);
  EXPECT_EQ(allowed.record.record().diagnostics[0].address, "b");
}

}  // namespace
}  // namespace torchlens
