#include "graph/trace_file_writer.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/from_blob.h>
#include <caffe2/serialize/inline_container.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <functional>
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
  while (size > 0 && error_.ok()) {
    const ssize_t written = ::write(fd_, bytes, size);
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) {
      error_ = WriteError(written < 0 ? errno : ENOSPC, partial_path_);
      return;
    }
    bytes += written;
    size -= static_cast<size_t>(written);
  }
}

TraceFileWriter::~TraceFileWriter() {
  if (!finished_ && error_.ok()) error_ = absl::CancelledError("the writer was destroyed");
  zip_.reset();  // writes the end of an abandoned file into nothing
  if (fd_ >= 0) ::close(fd_);
  if (!finished_) ::unlink(partial_path_.c_str());  // NOTE [Partial trace files]
}

absl::Status TraceFileWriter::WriteRecord(const void* bytes, size_t size, std::string* key) {
  if (!error_.ok()) return error_;
  *key = absl::StrCat(next_key_++);
  record_data_ = bytes;
  record_offset_ = -1;
  try {
    zip_->writeRecord(absl::StrCat("data/", *key), bytes, size);
  } catch (const std::exception& e) {
    const std::string what = e.what();
    error_ = absl::InternalError(absl::StrCat("cannot write trace file '", partial_path_,
                                              "': ", what.substr(0, what.find('\n'))));
  }
  return error_;
}

absl::Status TraceFileWriter::AddValue(int32_t node, int output, const at::Tensor& value) {
  if (!error_.ok()) return error_;
  if (value.layout() != at::kStrided || value.is_quantized() || !value.device().is_cpu()) {
    error_ = absl::InvalidArgumentError(absl::StrCat(
        "cannot write a ", value.is_quantized() ? "quantized" : c10::str(value.layout()),
        " tensor of node ", node, " to trace file '", path_,
        "': trace files written during capture hold strided CPU tensors; capture in memory "
        "and use SaveTrace instead"));
    return error_;
  }
  at::Tensor elements;
  {
    at::NoGradGuard no_grad;
    elements = value.detach().resolve_conj().resolve_neg().contiguous();
  }
  const size_t size = elements.nbytes();
  Record record{std::string(), elements.scalar_type(), elements.sizes().vec(), -1, at::Tensor()};
  if (absl::Status written = WriteRecord(elements.data_ptr(), size, &record.key); !written.ok()) {
    return written;
  }
  // The zip writer hands a stored record's bytes over as given (NOTE [Record placeholders]).
  record.offset = size > 0 ? record_offset_ : 0;
  if (record.offset < 0) {
    error_ = absl::InternalError(absl::StrCat("cannot write trace file '", partial_path_,
                                              "': the zip writer copied a record's bytes"));
    return error_;
  }
  bytes_written_ += static_cast<int64_t>(size);
  records_.insert_or_assign({node, output}, std::move(record));
  return absl::OkStatus();
}

at::Tensor TraceFileWriter::Placeholder(int32_t node, int output) {
  auto it = records_.find({node, output});
  if (it == records_.end()) return at::Tensor();
  Record& record = it->second;
  if (!record.placeholder.defined()) {  // NOTE [Record placeholders]
    record.placeholder = at::from_blob(
        mapping_->data() + record.offset, record.sizes, [keep = mapping_](void*) {},
        at::TensorOptions(record.dtype));
  }
  return record.placeholder;
}

absl::StatusOr<Trace> TraceFileWriter::WithPlaceholders(const Trace& trace) {
  TraceParts parts = trace.Parts();
  std::vector<Op>& ops = parts.ops;
  auto source_value = [&](const ArgSource& source) -> at::Tensor {
    if (source.kind != ArgSource::Kind::kNode) return at::Tensor();
    const int producer = trace.IndexOfLabel(source.name);
    return producer < 0 ? at::Tensor() : Placeholder(producer, source.output_index);
  };
  for (size_t i = 0; i < ops.size(); ++i) {
    Op& op = ops[i];
    const int32_t node = static_cast<int32_t>(i);
    if (op.is_output()) {
      // An output node holds its producer's value, named by its one source.
      if (!op.arg_sources.empty()) op.outs.assign(1, source_value(op.arg_sources[0]));
    } else {
      if (op.outs.empty() && records_.contains({node, 0})) op.outs.resize(1);
      for (size_t k = 0; k < op.outs.size(); ++k) op.outs[k] = Placeholder(node, k);
    }
    op.out = op.outs.empty() ? at::Tensor() : op.outs[0];
    for (size_t k = 0; k < op.alias_writes.size(); ++k) {
      op.alias_writes[k].value = Placeholder(node, -static_cast<int>(k) - 1);
    }
    size_t next_source = 0;
    for (c10::IValue& arg : op.creation_args) {
      if (!ContainsTensor(arg)) continue;
      arg = MapTensors(arg, [&](const at::Tensor& t) -> at::Tensor {
        const size_t s = next_source++;
        if (t.defined() || s >= op.arg_sources.size()) return t;
        return source_value(op.arg_sources[s]);
      });
    }
  }
  parts.has_saved_values = true;
  return Trace::Assemble(std::move(parts));
}

absl::StatusOr<Trace> TraceFileWriter::Finish(const Trace& trace) {
  if (finished_) return absl::FailedPreconditionError("TraceFileWriter::Finish was called twice");
  if (!error_.ok()) return error_;
  Flush();
  if (!error_.ok()) return error_;
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
  if (!error_.ok()) return error_;
  try {
    zip_->writeRecord("data.pkl", pickle.data(), pickle.size());
    zip_->writeEndOfFile();
    Flush();
  } catch (const std::exception& e) {
    const std::string what = e.what();
    if (error_.ok()) error_ = absl::InternalError(what.substr(0, what.find('\n')));
  }
  if (!error_.ok()) return error_;
  if (::close(fd_) != 0) {
    fd_ = -1;
    return WriteError(errno, partial_path_);
  }
  fd_ = -1;
  if (::rename(partial_path_.c_str(), path_.c_str()) != 0) return WriteError(errno, path_);
  finished_ = true;
  return with_placeholders;
}

}  // namespace torchlens
