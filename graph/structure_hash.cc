#include "graph/structure_hash.h"

#include <cstdint>

#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"

namespace torchlens {
namespace {

// 64-bit FNV-1a over a length-prefixed encoding, so that ("ab", "c") and ("a", "bc") differ.
class Fnv1a {
 public:
  void Bytes(absl::string_view bytes) {
    Int(static_cast<int64_t>(bytes.size()));
    for (unsigned char c : bytes) Byte(c);
  }
  void Int(int64_t value) {
    for (int i = 0; i < 8; ++i) Byte(static_cast<unsigned char>((value >> (8 * i)) & 0xff));
  }
  uint64_t value() const { return hash_; }

 private:
  void Byte(unsigned char c) {
    hash_ ^= c;
    hash_ *= 0x100000001b3ULL;
  }
  uint64_t hash_ = 0xcbf29ce484222325ULL;
};

}  // namespace

std::string StructureHash(const Trace& trace) {
  Fnv1a hash;
  hash.Int(static_cast<int64_t>(trace.ops().size()));
  for (const Op& op : trace.ops()) {
    hash.Int(static_cast<int64_t>(op.kind));
    hash.Bytes(op.type);
    hash.Bytes(op.func_name);
    hash.Bytes(op.overload_name);
    hash.Bytes(op.module_address);
    hash.Int(op.layer_type_index);
    hash.Int(op.layer_step_index);
    hash.Int(op.pass);
    hash.Int(static_cast<int64_t>(op.tensor_shape.size()));
    for (int64_t size : op.tensor_shape) hash.Int(size);
    hash.Bytes(op.tensor_dtype);
    hash.Int(static_cast<int64_t>(op.parent_indices.size()));
    for (int32_t parent : op.parent_indices) hash.Int(parent);
    hash.Bytes(op.address);
    hash.Int(op.buffer_write_kind.has_value() ? static_cast<int64_t>(*op.buffer_write_kind) : -1);
  }
  return absl::StrFormat("%016x", hash.value());
}

}  // namespace torchlens
