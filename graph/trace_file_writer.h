// Writing a trace file while its trace is captured: each value as it comes, then the
// trace's metadata, so that no value stays in memory (CaptureOptions::trace_file, NOTE
// [Streaming without saving] in torchlens_dispatch/capture_options.h).
//
//   absl::StatusOr<std::unique_ptr<TraceFileWriter>> writer = TraceFileWriter::Create(path);
//   (*writer)->AddValue(node, output, tensor);  // each value, as a value sink receives it
//   absl::StatusOr<Trace> trace = (*writer)->Finish(captured);
//
// The file is the one SaveTrace would write for the trace with its values (graph/
// trace_file.h), read back by LoadTrace and by Python's torch.load, with two differences
// that change no value: each streamed value is a record of its own, holding its elements
// in row-major order (a view does not share its base's record, and a value that is the
// same tensor as another, a buffer version that an op returned, is written twice), and
// records follow the order of the capture.
//
// NOTE [Partial trace files]
// Records go to "<path>.partial"; Finish renames it to `path` once the file is whole, and a
// writer destroyed before that removes it. A file at `path` is therefore always a whole
// trace file (an earlier one is replaced only by a complete new one).
#ifndef TORCHLENS_GRAPH_TRACE_FILE_WRITER_H_
#define TORCHLENS_GRAPH_TRACE_FILE_WRITER_H_

#include <ATen/core/Tensor.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "graph/trace.h"

namespace caffe2::serialize {
class PyTorchStreamWriter;
}  // namespace caffe2::serialize

namespace torchlens {

class TraceFileWriter {
 public:
  // The copies of values waiting to be written, or being written, hold at most this many
  // bytes, or one value when a value is larger (NOTE [Writing off the capturing thread]).
  static constexpr int64_t kQueueBytes = int64_t{8} << 20;

  // Creates "<path>.partial". Errors as WriteFileBytes (graph/file_io.h) gives them.
  static absl::StatusOr<std::unique_ptr<TraceFileWriter>> Create(std::string path);
  TraceFileWriter(const TraceFileWriter&) = delete;
  TraceFileWriter& operator=(const TraceFileWriter&) = delete;
  ~TraceFileWriter();  // removes the partial file unless Finish succeeded

  // Writes output `output` of node `node` (its position in the trace's ops; -(k + 1) for
  // its k-th alias write, as StreamedValue names it). kInvalidArgument for a tensor a
  // trace file cannot hold (not strided, quantized); write errors as WriteFileBytes.
  // After an error the writer writes nothing more and Finish returns the error.
  absl::Status AddValue(int32_t node, int output, const at::Tensor& value);

  // Writes `parameter`'s storage, from the writer thread and without a copy, so that
  // Finish need not (the ops' arguments name parameters). The parameter must not change
  // before Finish unless KeepParameterBeforeWrite is called first. Tensors a trace file
  // cannot hold are left for Finish.
  void AddParameter(const at::Tensor& parameter);
  // The model is about to write `parameter` (given to AddParameter) in place, for the
  // first time: the file keeps its value from before the write, and so do the arguments
  // of the trace Finish returns that read it (NOTE [Parameters written through views] in
  // torchlens_dispatch/parameter_state.h). Waits while the writer thread writes it.
  void KeepParameterBeforeWrite(const at::Tensor& parameter);

  // Completes the file for `trace`, captured with its values streamed here (its other
  // tensors, parameters read by its ops, buffer values and generator states, are written
  // now), renames it, and returns it with its values over the file, read on use as
  // LoadTrace reads them (NOTE [Values read on use]); parameters its ops read stay the
  // model's, as in a capture in memory.
  absl::StatusOr<Trace> Finish(const Trace& trace);

 private:
  class Mapping;  // of the file (NOTE [Record placeholders])
  // A value on disk: its record and what a tensor over it looks like.
  struct Record {
    std::string key;  // "data/<key>" in the archive
    at::ScalarType dtype;
    std::vector<int64_t> sizes;
    // Of the value as the model made it (a transpose, a slice with gaps or an expanded
    // value keeps its strides: a replay from the file then takes the kernel path the
    // capture took, bit for bit). NOTE [Streamed values keep their strides].
    std::vector<int64_t> strides;
    int64_t offset;          // of its bytes in the file
    at::Tensor placeholder;  // made by Finish, see NOTE [Record placeholders]
  };
  TraceFileWriter(std::string path, int fd);
  // The tensor standing for the record of (node, output), or undefined.
  at::Tensor Placeholder(int32_t node, int output);
  // A value's copy waiting for the writer thread (NOTE [Writing off the capturing
  // thread]).
  struct Queued {
    std::pair<int32_t, int> id;
    at::Tensor elements;
    int64_t bytes;           // of the copy (0 for a parameter, not copied)
    bool parameter = false;  // `elements` is a parameter: its whole storage, keyed by storage
    // A parameter's storage, the key (`elements` may be a copy of its bytes).
    const c10::StorageImpl* parameter_storage = nullptr;
  };
  // An argument, or a copy of a parameter's value before the model wrote it
  // (KeepParameterBeforeWrite) with the same geometry.
  at::Tensor ValueRead(const at::Tensor& argument) const;
  // The writer thread's loop.
  void WriteQueued();
  // Writes the record of value `id` (either thread, under zip_mu_) and notes where.
  void WriteValue(std::pair<int32_t, int> id, const at::Tensor& elements);
  // Ends the writer thread once the queue is written (or at once, dropping it).
  void StopWriting(bool abandon);
  // Records the first error (Finish returns it; AddValue refuses from then on).
  void SetError(absl::Status status);
  // The same from the thread that writes: its writes stop.
  void Fail(absl::Status status);
  absl::Status Error() const;
  // The zip writer's output: buffered, written to `fd_`; errors go to `error_`.
  void Append(const char* bytes, size_t size);
  void Flush();
  void WriteAll(const char* bytes, size_t size);
  // Writes `bytes` as record data/<key>; fills `*key`.
  absl::Status WriteRecord(const void* bytes, size_t size, std::string* key);
  // The trace with placeholders where its values are (Finish's first step).
  absl::StatusOr<Trace> WithPlaceholders(const Trace& trace);

  std::string path_;
  std::string partial_path_;
  int fd_ = -1;
  bool finished_ = false;

  // Shared by the capturing thread and the writer thread.
  mutable std::mutex mu_;
  std::condition_variable changed_;  // the queue, its bytes, `error_` or closing changed
  absl::Status error_;               // guarded by mu_
  std::deque<Queued> queue_;         // guarded by mu_: values
  std::deque<Queued> parameters_;    // guarded by mu_: written when no value waits
  int64_t queued_bytes_ = 0;         // guarded by mu_: queued or being written
  std::vector<at::Tensor> written_;  // guarded by mu_: copies written, to free
  bool closing_ = false;             // guarded by mu_
  bool abandoned_ = false;           // guarded by mu_
  // Guarded by mu_ while the writer thread runs; Finish's after.
  absl::flat_hash_map<std::pair<int32_t, int>, Record> records_;
  absl::flat_hash_map<const c10::StorageImpl*, std::string> parameter_keys_;
  // The parameter the writer thread is writing, guarded by mu_.
  const c10::StorageImpl* writing_parameter_ = nullptr;
  // Parameters the model wrote: their bytes from before (KeepParameterBeforeWrite), by
  // their storage; the capturing thread's.
  absl::flat_hash_map<const c10::StorageImpl*, c10::Storage> kept_parameters_;

  // Guarded by zip_mu_ while the writer thread runs (AddValue writes a value larger than
  // the queue itself); Finish's and the destructor's after.
  std::mutex zip_mu_;
  bool write_failed_ = false;
  int64_t next_key_ = 0;
  static constexpr size_t kBufferBytes = size_t{1} << 20;
  int64_t position_ = 0;               // bytes handed to Append
  const void* record_data_ = nullptr;  // the bytes of the record being written
  int64_t record_offset_ = -1;         // where they went
  std::shared_ptr<Mapping> mapping_;   // the values written, mapped by Finish
  std::vector<char> pending_;          // bytes not yet written
  std::unique_ptr<caffe2::serialize::PyTorchStreamWriter> zip_;
  std::thread writer_;  // last: started by the constructor, once the rest exists
};

// Writes `trace` to `path` as SaveTrace does (graph/trace_file.h), value by value through a
// TraceFileWriter, so that at most its queue of copies is in memory beside what the trace
// holds: for a trace whose values are on disk (LoadTrace's, a capture's to a trace_file),
// as the command-line tool writes again with the gradients a backward added after the
// capture (--stream_to --backward). `path` may be the file the trace's values are read
// from: it is replaced once the new one is whole. Errors as TraceFileWriter's.
absl::Status WriteTraceFile(const Trace& trace, const std::string& path);

}  // namespace torchlens

#endif  // TORCHLENS_GRAPH_TRACE_FILE_WRITER_H_
