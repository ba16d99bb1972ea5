// Running a pickle program on plain values: the check torchlens runs on every pickle in
// an archive before LibTorch reads it, and torchlens' own reader of `torch.save` data.
//
//   absl::StatusOr<PickleValues> values = RunPickle(program, {});
//   const PickleNode& root = values->nodes[values->root];
//
// NOTE [Pickle stack depth]
// LibTorch's unpickler pops its value stack without checking its size: a TUPLE2 with one
// value on the stack reads below it, and the REDUCE after it freed memory it never
// allocated (found by fuzzing; the model archives abort the same way with TUPLE3,
// BUILD and NEWOBJ). RunPickle runs the program on values and refuses any opcode that
// does not find the values it consumes above the innermost MARK, mark-ended opcodes
// without their MARK (and SETITEMS without key-value pairs), containers of the wrong kind
// (APPEND to a non-list), memo ids beyond the values memoized (the unpickler allocates
// room up to any id), and a STOP that does not leave exactly one value.
//
// NOTE [Pickled tensors]
// A tensor in a pickle is a call `torch._utils._rebuild_tensor_v2(storage, offset, size,
// stride, ...)` whose storage is a persistent id `('storage', torch.FloatStorage, key,
// location, numel)` naming the record `data/<key>`. LibTorch builds the tensor with those
// sizes and strides and never compares them with the storage: a tensor whose
// `offset + sum((size_i - 1) * stride_i) + 1` exceeds the storage's elements reads (and
// writes) past its allocation, and a storage whose `numel * itemsize` exceeds its record
// points past the record's buffer. RunPickle collects every tensor and storage with its
// metadata (`PickledTensor`, `PickledStorage`); archive_check.h checks each against its
// record before anything reads it.
//
// NOTE [LibTorch's pickle dialect]
// LibTorch 1.13's unpickler reads a subset of protocol 2: MARK, STOP, the EMPTY_ and
// mark-ended TUPLE, LIST and DICT, TUPLE1-3, APPENDS, SETITEMS, BININT, BININT1, BININT2,
// LONG1 of 8 bytes, BINFLOAT, BINUNICODE, NONE, NEWTRUE, NEWFALSE, GLOBAL, REDUCE, NEWOBJ,
// BUILD, BINPERSID, BINPUT, LONG_BINPUT, BINGET, LONG_BINGET, and PROTO first (measured
// opcode by opcode). Anything else makes it throw. That is harmless when it unpickles
// eagerly, but the debug information of a TorchScript archive is unpickled lazily,
// inside `ErrorReport::what()`, which is noexcept: a throw there ends the process.
// Pickles LibTorch reads are therefore checked in its dialect.
//
// Supported: the binary protocols 1 to 5 as `torch.save` and LibTorch's pickler write
// them (including APPEND, SETITEM, STACK_GLOBAL and MEMOIZE, which LibTorch 1.13's own
// unpickler does not read), the globals that build tensors, parameters, OrderedDicts,
// typed TorchScript lists, devices and torch.Size. With `allow_objects`, any other class
// or callable becomes an opaque `kObject` (TorchScript modules in a model archive);
// without it, it is an error naming it.
#ifndef TORCHLENS_GRAPH_PICKLE_VALUES_H_
#define TORCHLENS_GRAPH_PICKLE_VALUES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace torchlens {

inline constexpr uint32_t kNoNode = UINT32_MAX;

struct PickleNode {
  enum class Kind : uint8_t {
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kBytes,
    kTuple,
    kList,
    kDict,
    kGlobal,   // `text` is "module.name"
    kStorage,  // `index` into PickleValues::storages
    kTensor,   // `index` into PickleValues::tensors
    kDevice,   // `text` is "cpu", "cuda:0"
    kComplex,  // `float_value` + `imag_value` j (builtins.complex, a Python complex scalar)
    kObject,   // items[0] the class or callable, items[1] its arguments; `state` from BUILD
  };
  Kind kind = Kind::kNone;
  int64_t int_value = 0;        // kBool, kInt
  double float_value = 0;       // kFloat; kComplex: the real part
  double imag_value = 0;        // kComplex
  std::string text;             // kString, kBytes, kGlobal, kDevice
  std::vector<uint32_t> items;  // kTuple, kList: elements; kDict: key, value, key, value...
  uint32_t index = 0;           // kStorage, kTensor
  uint32_t state = kNoNode;     // kObject
  // kList, kDict: the TorchScript type a `restore_type_tag` or `build_intlist` (...) call
  // gave the container, "List[int]", "Dict[str, Any]"; empty when untyped.
  std::string type_tag;
  uint32_t depth = 1;  // nesting, bounded by PickleOptions::max_nesting
};

// NOTE [Pickle nesting by file kind]
// Deeper containers are refused, at a depth derived from who writes the file and what
// reads it after the check.
//   * torch.save files (inputs) and trace files: converted by graph/torch_load.cc, which
//     recurses with about 1.5 KB of stack per level, possibly on a Python thread's 8 MB;
//     Python's pickler cannot write deeper than its recursion limit, 1,000 by default, and
//     torchlens' trace writer never nests past a few levels. kMaxPickleNesting.
//   * TorchScript archives: written by LibTorch's C++ pickler, which nests each module's
//     object in its parent's state, one level per level of modules, whatever Python's
//     recursion limit; read by LibTorch on the loader thread's 512 MiB stack
//     (torchlens_dispatch/large_stack.h), whose archive check already bounds the methods at
//     4,096, each nested module bringing its forward. kMaxModelArchiveNesting allows two
//     levels per bounded method and stays far within that stack (LibTorch's loader and
//     the destruction of the values use well under 64 KiB per level).
inline constexpr uint32_t kMaxPickleNesting = 1000;
inline constexpr uint32_t kMaxModelArchiveNesting = 8192;

// Containers shared by reference can hold each other many times over: `x = [x, x]` sixty
// times is a few hundred bytes that every walk over its elements (the capture marking its
// inputs, a replay mapping arguments) would take 2^60 steps through. Values that count more
// elements than this, each container counted once per place it appears, are refused.
inline constexpr uint64_t kMaxPickleExpandedValues = uint64_t{1} << 26;

struct PickledStorage {
  std::string key;    // the record is data/<key> (constants/<key> in constants.pkl)
  std::string dtype;  // "Float", from the class torch.FloatStorage
  uint64_t item_size = 0;
  uint64_t numel = 0;
  std::string location;  // "cpu", "cuda:0"
};

struct PickledTensor {
  uint32_t storage = 0;  // index into PickleValues::storages
  int64_t offset = 0;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  bool requires_grad = false;
  // _rebuild_qtensor: its quantizer parameters, (torch.per_tensor_affine, scale,
  // zero_point) or (torch.per_channel_affine, scales, zero_points, axis); else kNoNode.
  uint32_t quantizer = kNoNode;
};

struct PickleValues {
  std::vector<PickleNode> nodes;
  std::vector<PickledStorage> storages;
  std::vector<PickledTensor> tensors;
  uint32_t root = kNoNode;
};

struct PickleOptions {
  bool allow_objects = false;  // see the header comment
  // Accept only what LibTorch 1.13's own unpickler reads (NOTE [LibTorch's pickle
  // dialect]): for pickles LibTorch runs after the check.
  bool libtorch_dialect = false;
  // NOTE [Pickle nesting by file kind].
  uint32_t max_nesting = kMaxPickleNesting;
};

// kInvalidArgument naming the opcode, its byte offset and what is wrong.
absl::StatusOr<PickleValues> RunPickle(absl::string_view program, const PickleOptions& options);

}  // namespace torchlens

#endif  // TORCHLENS_GRAPH_PICKLE_VALUES_H_
