// How a capture reads and writes the model's parameters: read by reference through the
// layout, kept as saved values once the forward writes them, and put back after a halt.
//
// NOTE [Parameters read by reference]
// A parameter's value is the model's, read through its detached alias
// (ModelLayout::param_values), so a saving capture keeps nothing per parameter read: the
// source names the parameter, no slot, no tensor-table entry, and the trace's arguments
// take the layout's alias (CaptureRecord::param_values). A slot and a table entry per
// parameter would cost a model of thousands of parameters a cold reference count each, a
// table twice the size of its op outputs, and their release with the trace. A parameter
// becomes an ordinary saved value only when the
// forward writes the storage it lives in, which is rare (a weight clamped in `forward`, a
// bias entry set through a view): before the write, each parameter read so far from that
// storage is saved and entered in the table (KeepParameter), so that the write copies its
// value first as it copies any saved value (NOTE [Copy-on-write of saved values]), and
// CaptureRecord::param_slots gives the reads before it that copy. A parameter first read
// after its storage was written is kept the same way, its values copied at the end as the
// model may write it again (NOTE [Parameters written through views]). Deciding costs a
// write one look at its storage's holders: a storage with one holder is no parameter's
// when every parameter's value is a detached alias (its second holder); otherwise one
// lookup in ModelLayout::param_storages. Streaming captures read parameters as themselves
// already (below), and captures without saved values keep no parameter value.
//
// NOTE [Parameters restored after a halt]
// A halted forward leaves the model as it was (CaptureOptions::halt_after): its buffers
// through the journal, and the parameters the forward wrote in place (a weight clamped or
// normalised in the forward) through a copy of each, taken before its first write. Only
// captures that may halt keep them, and only for written parameters.
//
// NOTE [Parameters written through views]
// A parameter is read as itself (a "param" source) until something writes it. An
// in-place op that returns it (`w.mul_(0.5)`) makes it that op's output, as for any
// tensor. A write through a view of it (`bias[0] = 1.0`, `w.narrow(0, 0, 2).zero_()`)
// returns the view, so before the write the parameter gets a constant source node holding
// its value before the write, named by its address (as a returned parameter's, NOTE
// [Constants]); the write is then an alias write of that node (NOTE [Writes through
// views]), and later reads of the parameter resolve to the write's output. Its reads
// before the write keep the value they read, and the values saved in its storage are
// copied at the end, as a buffer's are: the model's next forward may write it again. A capture
// without saved values does the same, so the graph is the same either way. A streaming capture
// keeps no copy: its reads of a parameter name the parameter, which the sink's owner writes as it
// likes (the trace file writes parameters on its own thread), so the first write to a parameter
// calls SetBeforeParameterWrite's hook first, and the file keeps the value from before it.
#ifndef TORCHLENS_DISPATCH_PARAMETER_STATE_H_
#define TORCHLENS_DISPATCH_PARAMETER_STATE_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "torchlens_dispatch/model_layout.h"

namespace torchlens {

class ParameterState {
 public:
  explicit ParameterState(const ModelLayout& layout) : layout_(layout) {}
  ParameterState(const ParameterState&) = delete;
  ParameterState& operator=(const ParameterState&) = delete;

  // The parameter id of `impl`, or -1 (ModelLayout::param_order, then param_ids).
  int32_t IdOf(const c10::TensorImpl* impl);

  // NOTE [Parameters read by reference], for a saving capture that does not stream.
  // `param` is read; false when it was read before (it then goes into the tensor table).
  bool FirstRead(int32_t param) {
    if (reads_.empty()) reads_.assign(layout_.params.size(), 0);
    if (reads_[param] & kRead) return false;
    reads_[param] |= kRead;
    return true;
  }
  bool any_read() const { return !reads_.empty(); }
  // Read by reference so far, not saved yet.
  bool ReadOnly(int32_t param) const { return reads_[param] == kRead; }
  void NoteKept(int32_t param) {
    if (reads_.empty()) reads_.assign(layout_.params.size(), 0);
    reads_[param] |= kKept;
  }
  // A write reached a parameter's storage: later first reads look at the storage.
  bool storage_written() const { return storage_written_; }
  void NoteStorageWritten() { storage_written_ = true; }

  // A streaming capture's hook, called with each parameter before the model first writes
  // it (NOTE [Parameters written through views]).
  void SetBeforeWrite(std::function<void(const at::Tensor&)> hook) {
    before_write_ = std::move(hook);
  }
  void BeforeWrite(const at::Tensor& parameter) const {
    if (before_write_) before_write_(parameter);
  }

  // NOTE [Parameters restored after a halt]: before a write of `tensor`, keeps the value
  // of the parameter living in its storage, the first time; Restore puts them back.
  void KeepBeforeHalt(const at::Tensor& tensor);
  void RestoreWritten();

 private:
  static constexpr uint8_t kRead = 1, kKept = 2;
  const ModelLayout& layout_;
  std::vector<uint8_t> reads_;  // by parameter id; empty until the first read
  bool storage_written_ = false;
  std::function<void(const at::Tensor&)> before_write_;
  size_t next_ = 0;  // in layout_.param_order: the parameter expected next
  // The parameters' storages (filled on the first write when the forward may halt) and
  // each written parameter's value from before its first write.
  absl::flat_hash_map<const c10::StorageImpl*, int32_t> storages_;
  std::vector<std::pair<int32_t, at::Tensor>> before_writes_;
};

}  // namespace torchlens

#endif  // TORCHLENS_DISPATCH_PARAMETER_STATE_H_
