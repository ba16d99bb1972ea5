#include "graph/trace_file_writer.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/set.h>
#include <caffe2/serialize/inline_container.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "graph/trace_file.h"
#include "torchlens_dispatch/ops/ivalue_tensors.h"

namespace torchlens {
namespace {

// NOTE [Record placeholders]
// Finish pickles the trace with SaveTrace's own code (TraceFileValue), each value already
// on disk stood for by a tensor over its record: the values written so far are mapped
// (page on use, copy-on-write, as LoadTrace maps a file: NOTE [Values read on use]) and
// each value becomes a tensor over its record's bytes. The pickler reads a tensor's
// metadata and its storage's identity only, and takes the record's name from
// `get_tensor_id`; every other tensor it meets (parameters an op read, buffer values,
// generator states) is written as a record there and then. The trace so pickled is the one
// Finish returns: no reading back.

// NOTE [Streamed values keep their strides]
// A kernel's result can depend on its input's strides (a reduction over `x[:, ::2]` or an
// expanded tensor adds in another order than over a dense copy), and validation compares
// replays bit for bit, so a value streamed to disk keeps the layout the op read, as a
// value saved in memory does. What is written is the value's span: its bytes from its
// first element to its last (strides are never negative), with its sizes and strides and
// offset 0. That is numel's bytes for a dense value, fewer for an expanded one (one row of
// `x.expand(512, 256)`), and more for a slice with gaps, which is written so only when the
// span is at most 4 times the elements or 1 MiB (NOTE [Saved copies keep their strides] in
// torchlens_dispatch/ops/saved_copy.h, the same rule): a column of a large matrix is written
// dense.

// The elements a value spans in its storage from its first one.
int64_t SpanElements(const at::Tensor& value) {
  if (value.numel() == 0) return 0;
  int64_t span = 1;
  for (int64_t d = 0; d < value.dim(); ++d) span += value.stride(d) * (value.size(d) - 1);
  return span;
}

// Whether the value is written as its span with its strides (NOTE [Streamed values keep
// their strides]); otherwise it is made contiguous.
bool WrittenWithItsStrides(const at::Tensor& value) {
  if (value.is_non_overlapping_and_dense()) return true;
  const int64_t span = SpanElements(value);
  constexpr int64_t kAlwaysBytes = 1 << 20;
  return span <= 4 * value.numel() ||
         span * static_cast<int64_t>(value.element_size()) <= kAlwaysBytes;
}

// The bytes written for `value`.
int64_t WrittenBytes(const at::Tensor& value) {
  const int64_t elements = WrittenWithItsStrides(value) ? SpanElements(value) : value.numel();
  return elements * static_cast<int64_t>(value.element_size());
}

// A copy of `value` for the writer thread: dense values and spans written with their
// strides keep them, others become contiguous.
at::Tensor WrittenCopy(const at::Tensor& value) {
  if (value.is_non_overlapping_and_dense()) return value.clone(at::MemoryFormat::Preserve);
  if (!WrittenWithItsStrides(value)) return value.contiguous();
  const int64_t span = SpanElements(value);
  at::Tensor flat = at::empty({span}, value.options());
  flat.copy_(value.as_strided({span}, {1}));  // from the value's first element
  return flat.as_strided(value.sizes(), value.strides());
}

absl::Status WriteError(int error, const std::string& path) {
  return absl::ErrnoToStatus(error, absl::StrCat("cannot write trace file '", path, "'"));
}

}  // namespace

class TraceFileWriter::Mapping {
 public:
  Mapping(void* data, size_t size) : data_(data), size_(size) {}
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() { ::munmap(data_, size_); }
  char* data() const { return static_cast<char*>(data_); }

 private:
  void* data_;
  size_t size_;
};

absl::StatusOr<std::unique_ptr<TraceFileWriter>> TraceFileWriter::Create(std::string path) {
  const std::string partial = absl::StrCat(path, ".partial");
  // Read too: Finish maps what it wrote (NOTE [Record placeholders]).
  const int fd = ::open(partial.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return WriteError(errno, partial);
  return std::unique_ptr<TraceFileWriter>(new TraceFileWriter(std::move(path), fd));
}

TraceFileWriter::TraceFileWriter(std::string path, int fd)
    : path_(std::move(path)), partial_path_(absl::StrCat(path_, ".partial")), fd_(fd) {
  // Every write reports success to the zip writer, whose error path throws and whose
  // destructor would then end the process; errors are kept in `error_` instead, and
  // after one the bytes are dropped.
  zip_ = std::make_unique<caffe2::serialize::PyTorchStreamWriter>(
      [this](const void* data, size_t size) -> size_t {
        Append(static_cast<const char*>(data), size);
        return size;
      });
  writer_ = std::thread([this] { WriteQueued(); });
}

void TraceFileWriter::Fail(absl::Status status) {
  write_failed_ = true;
  SetError(std::move(status));
}

void TraceFileWriter::SetError(absl::Status status) {
  std::lock_guard<std::mutex> lock(mu_);
  if (error_.ok()) error_ = std::move(status);
  changed_.notify_all();  // AddValue may be waiting for room
}

absl::Status TraceFileWriter::Error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

void TraceFileWriter::WriteQueued() {
  // NOTE [Writing off the capturing thread]
  // Computing a record's CRC-32 and writing it take about as long as the forward that
  // made it. AddValue therefore only copies the
  // value (the model may write the tensor in place as soon as it returns) and queues the
  // copy; this thread writes the queue in order. The copies queued or being written hold
  // at most kQueueBytes (or one value, when a value is larger), so the capture's memory
  // stays bounded: AddValue waits for room. A value larger than the whole queue is not
  // copied: AddValue waits until the queue is written and writes it itself (a large model's
  // values, 100 MB each, would otherwise be copied and then waited for anyway). A written
  // copy is freed by the thread that
  // made it, at its next AddValue, before a new copy is made: LibTorch's allocator reports memory
  // per thread, and a copy freed here would count forever on the capturing thread. Finish stops
  // this thread, after the queue is written, before it touches the file.
  while (true) {
    Queued item;
    {
      std::unique_lock<std::mutex> lock(mu_);
      changed_.wait(lock, [this] { return !queue_.empty() || !parameters_.empty() || closing_; });
      if (abandoned_ || (queue_.empty() && parameters_.empty())) return;
      // Values first: the capturing thread may be waiting for room.
      std::deque<Queued>& from = queue_.empty() ? parameters_ : queue_;
      item = std::move(from.front());
      from.pop_front();
      if (item.parameter) writing_parameter_ = item.parameter_storage;
    }
    if (item.parameter) {
      const c10::Storage& storage = item.elements.storage();
      std::string key;
      std::unique_lock<std::mutex> zip_lock(zip_mu_);
      const bool written = WriteRecord(storage.data(), storage.nbytes(), &key).ok();
      zip_lock.unlock();
      std::lock_guard<std::mutex> lock(mu_);
      if (written) {
        // The copy's storage too, when the model wrote the parameter after (its arguments
        // read the copy: ValueRead).
        if (storage.unsafeGetStorageImpl() != item.parameter_storage) {
          parameter_keys_.emplace(storage.unsafeGetStorageImpl(), key);
        }
        parameter_keys_.emplace(item.parameter_storage, std::move(key));
      }
      writing_parameter_ = nullptr;
      changed_.notify_all();
      continue;
    }
    WriteValue(item.id, item.elements);
    std::lock_guard<std::mutex> lock(mu_);
    queued_bytes_ -= item.bytes;
    written_.push_back(std::move(item.elements));
    changed_.notify_all();
  }
}

void TraceFileWriter::WriteValue(std::pair<int32_t, int> id, const at::Tensor& elements) {
  // `elements` is dense, or spans its bytes with its strides (NOTE [Streamed values keep
  // their strides]): its span is written.
  Record record{
      std::string(), elements.scalar_type(), elements.sizes().vec(), elements.strides().vec(), -1,
      at::Tensor()};
  const size_t size =
      static_cast<size_t>(SpanElements(elements)) * static_cast<size_t>(elements.element_size());
  std::unique_lock<std::mutex> zip_lock(zip_mu_);
  const bool written = WriteRecord(elements.data_ptr(), size, &record.key).ok();
  // The zip writer hands a stored record's bytes over as given (NOTE [Record
  // placeholders]).
  record.offset = size > 0 ? record_offset_ : 0;
  if (written && record.offset < 0) {
    Fail(absl::InternalError(absl::StrCat("cannot write trace file '", partial_path_,
                                          "': the zip writer copied a record's bytes")));
  }
  zip_lock.unlock();
  std::lock_guard<std::mutex> lock(mu_);
  if (written && record.offset >= 0) records_.insert_or_assign(id, std::move(record));
}

void TraceFileWriter::StopWriting(bool abandon) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closing_ = true;
    abandoned_ = abandon;
    changed_.notify_all();
  }
  if (writer_.joinable()) writer_.join();
}

void TraceFileWriter::Append(const char* bytes, size_t size) {
  if (bytes == record_data_) record_offset_ = position_;  // NOTE [Record placeholders]
  position_ += size;
  // The zip writer hands over a record in several small pieces (header, name, padding,
  // data): they are gathered into one write. A record's data above 64 KiB goes straight
  // to the file, not copied first.
  constexpr size_t kDirectBytes = size_t{64} << 10;
  if (pending_.size() + size > kBufferBytes || size >= kDirectBytes) Flush();
  if (size >= kDirectBytes) {
    WriteAll(bytes, size);
  } else {
    pending_.insert(pending_.end(), bytes, bytes + size);
  }
}

void TraceFileWriter::Flush() {
  WriteAll(pending_.data(), pending_.size());
  pending_.clear();
}

void TraceFileWriter::WriteAll(const char* bytes, size_t size) {
  while (size > 0 && !write_failed_) {
    const ssize_t written = ::write(fd_, bytes, size);
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) {
      Fail(WriteError(written < 0 ? errno : ENOSPC, partial_path_));
      return;
    }
    bytes += written;
    size -= static_cast<size_t>(written);
  }
}

TraceFileWriter::~TraceFileWriter() {
  StopWriting(/*abandon=*/true);
  written_.clear();
  if (!finished_) Fail(absl::CancelledError("the writer was destroyed"));
  zip_.reset();  // writes the end of an abandoned file into nothing
  if (fd_ >= 0) ::close(fd_);
  if (!finished_) ::unlink(partial_path_.c_str());  // NOTE [Partial trace files]
}

absl::Status TraceFileWriter::WriteRecord(const void* bytes, size_t size, std::string* key) {
  if (write_failed_) return Error();
  *key = absl::StrCat(next_key_++);
  record_data_ = bytes;
  record_offset_ = -1;
  try {
    zip_->writeRecord(absl::StrCat("data/", *key), bytes, size);
  } catch (const std::exception& e) {
    const std::string what = e.what();
    Fail(absl::InternalError(absl::StrCat("cannot write trace file '", partial_path_,
                                          "': ", what.substr(0, what.find('\n')))));
  }
  return write_failed_ ? Error() : absl::OkStatus();
}

void TraceFileWriter::AddParameter(const at::Tensor& parameter) {
  if (!parameter.defined() || parameter.layout() != at::kStrided || parameter.is_quantized() ||
      !parameter.device().is_cpu() || !parameter.has_storage()) {
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  parameters_.push_back(Queued{{-1, 0},
                               parameter,
                               0,
                               /*parameter=*/true,
                               parameter.storage().unsafeGetStorageImpl()});
  changed_.notify_all();
}

void TraceFileWriter::KeepParameterBeforeWrite(const at::Tensor& parameter) {
  if (!parameter.defined() || !parameter.has_storage()) return;
  const c10::Storage& storage = parameter.storage();
  const c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
  if (kept_parameters_.contains(impl)) return;
  at::Tensor copy = at::empty({static_cast<int64_t>(storage.nbytes())}, at::kByte);
  if (storage.nbytes() > 0) std::memcpy(copy.data_ptr(), storage.data(), storage.nbytes());
  kept_parameters_.emplace(impl, copy.storage());
  std::unique_lock<std::mutex> lock(mu_);
  for (Queued& item : parameters_) {
    if (item.parameter_storage == impl) {  // not written yet: the copy is what gets written
      item.elements = std::move(copy);
      return;
    }
  }
  // Written, or being written, before the model's write: those bytes are the value before.
  changed_.wait(lock, [&] { return writing_parameter_ != impl; });
  if (auto it = parameter_keys_.find(impl); it != parameter_keys_.end()) {
    std::string key = it->second;  // not a reference into the map emplace may grow
    parameter_keys_.emplace(copy.storage().unsafeGetStorageImpl(), std::move(key));
  }
}

at::Tensor TraceFileWriter::ValueRead(const at::Tensor& argument) const {
  if (kept_parameters_.empty() || !argument.defined() || !argument.has_storage()) return argument;
  auto it = kept_parameters_.find(argument.storage().unsafeGetStorageImpl());
  if (it == kept_parameters_.end()) return argument;
  at::Tensor before = at::empty({0}, at::TensorOptions().dtype(argument.scalar_type()));
  before.set_(it->second, argument.storage_offset(), argument.sizes(), argument.strides());
  return before;
}

absl::Status TraceFileWriter::AddValue(int32_t node, int output, const at::Tensor& value) {
  if (value.layout() != at::kStrided || value.is_quantized() || !value.device().is_cpu()) {
    SetError(absl::InvalidArgumentError(absl::StrCat(
        "cannot write a ", value.is_quantized() ? "quantized" : c10::str(value.layout()),
        " tensor of node ", node, " to trace file '", path_,
        "': trace files written during capture hold strided CPU tensors; capture in memory "
        "and use SaveTrace instead")));
    return Error();
  }
  // NOTE [Writing off the capturing thread]: room first, then the copy.
  std::vector<at::Tensor> written;
  const int64_t bytes = WrittenBytes(value);
  if (bytes > kQueueBytes) {
    // Larger than the queue: written here, without a copy, once the queued values are.
    {
      std::unique_lock<std::mutex> lock(mu_);
      changed_.wait(lock, [&] { return queued_bytes_ == 0 || !error_.ok(); });
      if (!error_.ok()) return error_;
      written.swap(written_);
    }
    written.clear();
    at::Tensor elements;
    {
      at::NoGradGuard no_grad;
      elements = value.detach().resolve_conj().resolve_neg();
      if (!WrittenWithItsStrides(elements)) elements = elements.contiguous();
    }
    WriteValue({node, output}, elements);
    return Error();
  }
  {
    std::unique_lock<std::mutex> lock(mu_);
    changed_.wait(lock, [&] {
      return queued_bytes_ == 0 || !error_.ok() || queued_bytes_ + bytes <= kQueueBytes;
    });
    if (!error_.ok()) return error_;
    queued_bytes_ += bytes;
    written.swap(written_);
  }
  written.clear();  // freed by the thread that copied them
  Queued item{{node, output}, at::Tensor(), bytes};
  try {
    at::NoGradGuard no_grad;
    // NOTE [Streamed values keep their strides].
    item.elements = WrittenCopy(value.detach().resolve_conj().resolve_neg());
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    queued_bytes_ -= bytes;
    throw;
  }
  std::lock_guard<std::mutex> lock(mu_);
  queue_.push_back(std::move(item));
  changed_.notify_all();
  return absl::OkStatus();
}

at::Tensor TraceFileWriter::Placeholder(int32_t node, int output) {
  auto it = records_.find({node, output});
  if (it == records_.end()) return at::Tensor();
  Record& record = it->second;
  if (!record.placeholder.defined()) {  // NOTE [Record placeholders]
    record.placeholder = at::from_blob(
        mapping_->data() + record.offset, record.sizes, record.strides, [keep = mapping_](void*) {},
        at::TensorOptions(record.dtype));
  }
  return record.placeholder;
}

absl::StatusOr<Trace> TraceFileWriter::WithPlaceholders(const Trace& trace) {
  // The trace Finish returns replaces the captured one: gradients that arrive later are its
  // (NOTE [Gradients in a trace] in graph/gradients.h).
  TraceParts parts = trace.Parts(/*gradients_follow=*/true);
  std::vector<Op>& ops = parts.ops;
  auto source_value = [&](const ArgSource& source) -> at::Tensor {
    if (source.kind != ArgSource::Kind::kNode) return at::Tensor();
    const int producer = source.node;
    return producer < 0 ? at::Tensor() : Placeholder(producer, source.output_index);
  };
  for (size_t i = 0; i < ops.size(); ++i) {
    Op& op = ops[i];
    const int32_t node = static_cast<int32_t>(i);
    if (op.is_output()) {
      // An output node holds its producer's value, named by its one source.
      if (!op.arg_sources.empty()) op.outs = {source_value(op.arg_sources[0])};
    } else {
      if (op.outs.empty() && records_.contains({node, 0})) op.outs.resize(1);
      for (size_t k = 0; k < op.outs.size(); ++k) op.outs.mutable_at(k) = Placeholder(node, k);
    }
    op.out = op.outs.empty() ? at::Tensor() : op.outs[0];
    for (size_t k = 0; k < op.alias_writes.size(); ++k) {
      op.alias_writes[k].value = Placeholder(node, -static_cast<int>(k) - 1);
    }
    size_t next_source = 0;
    for (c10::IValue& arg : op.creation_args.mutable_span()) {
      if (!ContainsTensor(arg)) continue;
      arg = MapTensors(arg, [&](const at::Tensor& t) -> at::Tensor {
        const size_t s = next_source++;
        if (t.defined() || s >= op.arg_sources.size()) return ValueRead(t);
        return source_value(op.arg_sources[s]);
      });
    }
  }
  parts.has_saved_values = true;
  return Trace::Assemble(std::move(parts));
}

absl::StatusOr<Trace> TraceFileWriter::Finish(const Trace& trace) {
  if (finished_) return absl::FailedPreconditionError("TraceFileWriter::Finish was called twice");
  StopWriting(/*abandon=*/false);  // the queue written; this thread writes from here
  written_.clear();
  if (absl::Status error = Error(); !error.ok()) return error;
  Flush();
  if (write_failed_) return Error();
  if (position_ > 0) {  // the values written so far (NOTE [Record placeholders])
    void* data = ::mmap(nullptr, position_, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd_, 0);
    if (data == MAP_FAILED) return WriteError(errno, partial_path_);
    mapping_ = std::make_shared<Mapping>(data, position_);
  }
  absl::StatusOr<Trace> with_placeholders = WithPlaceholders(trace);
  if (!with_placeholders.ok()) return with_placeholders.status();
  absl::StatusOr<c10::IValue> value = TraceFileValue(*with_placeholders);
  if (!value.ok()) return value.status();
  // The records of the placeholders' storages.
  absl::flat_hash_map<const c10::StorageImpl*, const std::string*> keys;
  for (const auto& [id, record] : records_) {
    if (record.placeholder.defined()) {
      keys.emplace(record.placeholder.storage().unsafeGetStorageImpl(), &record.key);
    }
  }
  std::vector<char> pickle;
  try {
    torch::jit::Pickler pickler(
        [&](const char* bytes, size_t size) { pickle.insert(pickle.end(), bytes, bytes + size); },
        /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
        [&](const at::Tensor& tensor) -> std::string {
          const c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
          if (auto it = keys.find(storage); it != keys.end()) return *it->second;
          if (auto it = parameter_keys_.find(storage); it != parameter_keys_.end()) {
            return it->second;  // written during the capture (AddParameter)
          }
          // Any other tensor: its whole storage, as SaveTrace writes it.
          std::string key;
          (void)WriteRecord(tensor.storage().data(), tensor.storage().nbytes(), &key);
          return key;
        });
    pickler.protocol();
    pickler.pushIValue(*value);
    pickler.stop();
  } catch (const std::exception& e) {
    const std::string what = e.what();
    return absl::InternalError(
        absl::StrCat("cannot serialize the trace: ", what.substr(0, what.find('\n'))));
  }
  if (write_failed_) return Error();
  try {
    zip_->writeRecord("data.pkl", pickle.data(), pickle.size());
    zip_->writeEndOfFile();
    Flush();
  } catch (const std::exception& e) {
    const std::string what = e.what();
    Fail(absl::InternalError(what.substr(0, what.find('\n'))));
  }
  if (write_failed_) return Error();
  if (::close(fd_) != 0) {
    fd_ = -1;
    return WriteError(errno, partial_path_);
  }
  fd_ = -1;
  if (::rename(partial_path_.c_str(), path_.c_str()) != 0) return WriteError(errno, path_);
  finished_ = true;
  return with_placeholders;
}

absl::Status WriteTraceFile(const Trace& trace, const std::string& path) {
  absl::StatusOr<std::unique_ptr<TraceFileWriter>> writer = TraceFileWriter::Create(path);
  if (!writer.ok()) return writer.status();
  const std::vector<Op>& ops = trace.ops();
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    if (op.is_output()) continue;  // its producer's value
    const int32_t node = static_cast<int32_t>(i);
    const size_t outputs = std::max<size_t>(op.outs.size(), 1);
    for (size_t k = 0; k < outputs; ++k) {
      const at::Tensor& value = OutputValue(op, static_cast<int>(k));
      if (!value.defined()) continue;
      if (absl::Status added = (*writer)->AddValue(node, static_cast<int>(k), value); !added.ok()) {
        return added;
      }
    }
    for (size_t k = 0; k < op.alias_writes.size(); ++k) {
      const at::Tensor& value = op.alias_writes[k].value;
      if (!value.defined()) continue;
      if (absl::Status added = (*writer)->AddValue(node, -static_cast<int>(k) - 1, value);
          !added.ok()) {
        return added;
      }
    }
  }
  // The arguments a node produced are that node's records, as in a streaming capture's trace
  // (NOTE [Streaming without saving] in torchlens_dispatch/capture_options.h).
  TraceParts parts = trace.Parts();
  for (Op& op : parts.ops) {
    size_t next_source = 0;
    for (c10::IValue& arg : op.creation_args.mutable_span()) {
      if (!ContainsTensor(arg)) continue;
      arg = MapTensors(arg, [&](const at::Tensor& t) -> at::Tensor {
        const size_t s = next_source++;
        const bool from_node =
            s < op.arg_sources.size() && op.arg_sources[s].kind == ArgSource::Kind::kNode;
        return from_node ? at::Tensor() : t;
      });
    }
  }
  absl::StatusOr<Trace> written = (*writer)->Finish(Trace::Assemble(std::move(parts)));
  return written.ok() ? absl::OkStatus() : written.status();
}

}  // namespace torchlens
