// The machine RunPickle (graph/pickle_values.h) runs: the opcode interpreter of the pickle
// dialect with its stack (pickle_values.cc), and the calls of the globals it knows, which
// turn a pickle's tuples into storages, tensors, devices and typed lists (pickle_calls.cc).
// Internal to graph/pickle_values.
#ifndef TORCHLENS_GRAPH_PICKLE_MACHINE_H_
#define TORCHLENS_GRAPH_PICKLE_MACHINE_H_

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "graph/pickle_values.h"

namespace torchlens {

// "a tuple", "an int", ...: a value's kind in messages.
const char* PickleKindName(PickleNode::Kind kind);

class PickleMachine {
 public:
  using Kind = PickleNode::Kind;

  PickleMachine(absl::string_view program, const PickleOptions& options)
      : program_(program), options_(options) {}
  PickleMachine(const PickleMachine&) = delete;
  PickleMachine& operator=(const PickleMachine&) = delete;

  absl::StatusOr<PickleValues> Run();

 private:
  absl::Status Error(absl::string_view why) const {
    return absl::InvalidArgumentError(
        absl::StrCat("pickle opcode 0x", absl::Hex(op_), " at byte ", op_start_, ": ", why));
  }

  // ---- reading the program ----
  absl::Status Take(uint64_t n, absl::string_view* out);
  absl::Status TakeUint(int n, uint64_t* out);
  absl::Status TakeLine(absl::string_view* out);
  absl::Status TakeCounted(int length_bytes, absl::string_view* out);

  // ---- values ----
  PickleNode& Node(uint32_t id) { return values_.nodes[id]; }

  absl::StatusOr<uint32_t> New(PickleNode node) {
    for (uint32_t item : node.items) node.depth = std::max(node.depth, Node(item).depth + 1);
    if (node.state != kNoNode) node.depth = std::max(node.depth, Node(node.state).depth + 1);
    if (node.depth > options_.max_nesting) {
      return Error(absl::StrCat("values nest deeper than ", options_.max_nesting, " levels"));
    }
    values_.nodes.push_back(std::move(node));
    return static_cast<uint32_t>(values_.nodes.size() - 1);
  }
  absl::Status Push(PickleNode node) {
    absl::StatusOr<uint32_t> id = New(std::move(node));
    if (!id.ok()) return id.status();
    stack_.push_back(*id);
    return absl::OkStatus();
  }
  static PickleNode Scalar(Kind kind, int64_t value = 0) {
    PickleNode node;
    node.kind = kind;
    node.int_value = value;
    return node;
  }
  static PickleNode Text(Kind kind, absl::string_view text) {
    PickleNode node;
    node.kind = kind;
    node.text = std::string(text);
    return node;
  }
  static PickleNode Container(Kind kind, std::vector<uint32_t> items = {}) {
    PickleNode node;
    node.kind = kind;
    node.items = std::move(items);
    return node;
  }
  // Adds `items` to the container `id`, which may already sit inside others.
  absl::Status Extend(uint32_t id, const std::vector<uint32_t>& items) {
    for (uint32_t item : items) {
      Node(id).depth = std::max(Node(id).depth, Node(item).depth + 1);
      Node(id).items.push_back(item);
    }
    if (Node(id).depth > options_.max_nesting) {
      return Error(absl::StrCat("values nest deeper than ", options_.max_nesting, " levels"));
    }
    return absl::OkStatus();
  }

  // ---- the stack (NOTE [Pickle stack depth]) ----
  size_t Floor() const { return marks_.empty() ? 0 : marks_.back(); }
  // Pops `n` values above the innermost MARK, the deepest first.
  absl::Status Pop(size_t n, std::vector<uint32_t>* out);
  // Pops everything above the innermost MARK, and the MARK.
  absl::Status PopMarked(std::vector<uint32_t>* out);
  // The container an APPEND(S) / SETITEM(S) adds to: the value at the top (above the
  // innermost MARK), which must be of `kind`.
  absl::Status Target(Kind kind, uint32_t* id);
  absl::Status Memo(uint64_t id);
  absl::Status Recall(uint64_t id);
  absl::Status PushInt(absl::string_view little_endian);

  // See NOTE [LibTorch's pickle dialect].
  bool InLibTorchDialect() const;

  // Runs the opcode at op_start_ (op_), whose argument starts at at_.
  absl::Status Step();

  // ---- the calls (pickle_calls.cc) ----
  // ('storage', torch.FloatStorage, key, location, numel): NOTE [Pickled tensors].
  absl::Status PersistentId(uint32_t id);
  // A tuple of ints (or a torch.Size, which REDUCE turns into one).
  bool IntTuple(uint32_t id, std::vector<int64_t>* out);
  // _rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks[, metadata]),
  // _rebuild_tensor(storage, offset, size, stride), _rebuild_qtensor(storage, offset,
  // size, stride, quantizer_params, requires_grad, hooks).
  absl::Status RebuildTensor(const std::vector<uint32_t>& args, absl::string_view name);
  // REDUCE: calls the global `callable` with the tuple `args_id`.
  absl::Status Reduce(uint32_t callable, uint32_t args_id);
  // NEWOBJ, and REDUCE of a global it does not know: an opaque object with allow_objects.
  absl::Status NewObject(uint32_t type, uint32_t args);

  absl::string_view program_;
  PickleOptions options_;
  uint64_t at_ = 0;
  uint64_t op_start_ = 0;
  uint8_t op_ = 0;
  PickleValues values_;
  absl::flat_hash_map<std::string, uint32_t> storage_indexes_;  // by key, into values_.storages
  std::vector<uint32_t> stack_;
  std::vector<size_t> marks_;
  std::vector<uint32_t> memo_;
};

}  // namespace torchlens

#endif  // TORCHLENS_GRAPH_PICKLE_MACHINE_H_
