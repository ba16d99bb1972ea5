// libFuzzer target: the key parser behind Trace::Find, and Find itself on a small trace.
#include <cstddef>
#include <cstdint>
#include <string>

#include "graph/label.h"
#include "graph/trace.h"

namespace {

const torchlens::Trace& SmallTrace() {
  static const torchlens::Trace* trace = [] {
    torchlens::TraceParts parts;
    for (const char* label :
         {"input_1", "relu_1_1:1", "relu_1_1:2", "buffer_1:1", "buffer_1:2", "output_1"}) {
      torchlens::Op op;
      op.label = label;
      op.type = std::string(label).substr(0, std::string(label).find('_'));
      if (op.type == "buffer") {
        op.kind = torchlens::OpKind::kBufferVersion;
        op.address = "bn.running_mean";
        op.buffer_pass = label[9] - '0';
      }
      parts.ops.push_back(op);
    }
    parts.ops[4].buffer_write_kind = torchlens::WriteKind::kFused;
    parts.buffers["bn.running_mean"].address = "bn.running_mean";
    return new torchlens::Trace(torchlens::Trace::Assemble(std::move(parts)));
  }();
  return *trace;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string key(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<torchlens::ParsedKey> parsed = torchlens::ParseKey(key);
  if (parsed.ok() && parsed->base.empty()) __builtin_trap();  // the contract says never
  absl::StatusOr<const torchlens::Op*> op = SmallTrace().Find(key);
  if (op.ok() && *op == nullptr) __builtin_trap();
  return 0;
}
