// One file over 600 lines, on purpose: it is one machine, the pickle dialect's opcode
// interpreter (`Machine::Step`, one case per opcode of NOTE [LibTorch's pickle dialect])
// with the stack discipline every case shares. Split, the opcode table and the checks of
// NOTE [Pickle stack depth] would be read in pieces.
#include "graph/pickle_values.h"

#include <cstring>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace torchlens {
namespace {

using Kind = PickleNode::Kind;

const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return "a bool";
    case Kind::kInt:
      return "an int";
    case Kind::kFloat:
      return "a float";
    case Kind::kString:
      return "a string";
    case Kind::kBytes:
      return "bytes";
    case Kind::kTuple:
      return "a tuple";
    case Kind::kList:
      return "a list";
    case Kind::kDict:
      return "a dict";
    case Kind::kGlobal:
      return "a global";
    case Kind::kStorage:
      return "a storage";
    case Kind::kTensor:
      return "a tensor";
    case Kind::kDevice:
      return "a device";
    case Kind::kComplex:
      return "a complex number";
    case Kind::kObject:
      return "an object";
  }
  return "a value";
}

// Whether `tag` can be a type tag TorchScript's pickler wrote ("List[Tensor]",
// "Dict[str, List[Tuple[Tensor, int]]]"). Tags are parsed by LibTorch's type parser, which
// recurses once per bracket with no limit of its own: a tag of 200,000 "List[" overflowed
// the stack (a crash no status can report), so tags are bounded before anything parses
// them. Real tags are a few dozen characters and nest a few levels.
constexpr size_t kMaxTypeTagLength = 4096;
constexpr int kMaxTypeTagNesting = 32;
bool PlausibleTypeTag(absl::string_view tag) {
  if (tag.empty() || tag.size() > kMaxTypeTagLength) return false;
  int depth = 0;
  for (const char c : tag) {
    if (c == '[' || c == '(') ++depth;
    if (c == ']' || c == ')') --depth;
    if (depth > kMaxTypeTagNesting || depth < 0) return false;
  }
  return depth == 0;
}

// The storage classes `torch.save` names (torch.FloatStorage, ...) and their item sizes.
uint64_t StorageItemSize(absl::string_view dtype) {
  static constexpr std::pair<const char*, uint64_t> kStorages[] = {
      {"Byte", 1},        {"Char", 1},         {"Short", 2},          {"Int", 4},
      {"Long", 8},        {"Half", 2},         {"Float", 4},          {"Double", 8},
      {"ComplexHalf", 4}, {"ComplexFloat", 8}, {"ComplexDouble", 16}, {"Bool", 1},
      {"QInt8", 1},       {"QUInt8", 1},       {"QInt32", 4},         {"BFloat16", 2},
      {"QUInt4x2", 1},    {"QUInt2x4", 1},
  };
  for (const auto& [name, size] : kStorages) {
    if (dtype == name) return size;
  }
  return 0;
}

// The TorchScript list type each `torch.jit._pickle.build_*` gives its argument.
const char* BuiltListType(absl::string_view name) {
  if (name == "torch.jit._pickle.build_intlist") return "List[int]";
  if (name == "torch.jit._pickle.build_doublelist") return "List[float]";
  if (name == "torch.jit._pickle.build_boollist") return "List[bool]";
  if (name == "torch.jit._pickle.build_tensorlist") return "List[Tensor]";
  if (name == "torch.jit._pickle.build_strlist") return "List[str]";
  return nullptr;
}

class Machine {
 public:
  Machine(absl::string_view program, const PickleOptions& options)
      : program_(program), options_(options) {}

  absl::StatusOr<PickleValues> Run() {
    while (at_ < program_.size()) {
      op_start_ = at_;
      op_ = static_cast<uint8_t>(program_[at_++]);
      if (op_ == '.') {  // STOP
        if (stack_.size() != 1 || !marks_.empty()) {
          return Error("the program stops without exactly one value");
        }
        values_.root = stack_.back();
        return std::move(values_);
      }
      if (absl::Status s = Step(); !s.ok()) return s;
    }
    return absl::InvalidArgumentError("pickle program ends without a STOP opcode (truncated?)");
  }

 private:
  absl::Status Error(absl::string_view why) const {
    return absl::InvalidArgumentError(
        absl::StrCat("pickle opcode 0x", absl::Hex(op_), " at byte ", op_start_, ": ", why));
  }

  // ---- reading the program ----
  absl::Status Take(uint64_t n, absl::string_view* out) {
    if (n > program_.size() - at_) return Error("its argument runs past the end of the program");
    *out = program_.substr(at_, n);
    at_ += n;
    return absl::OkStatus();
  }
  absl::Status TakeUint(int n, uint64_t* out) {
    absl::string_view bytes;
    if (absl::Status s = Take(n, &bytes); !s.ok()) return s;
    *out = 0;
    for (int i = n - 1; i >= 0; --i) *out = (*out << 8) | static_cast<uint8_t>(bytes[i]);
    return absl::OkStatus();
  }
  absl::Status TakeLine(absl::string_view* out) {
    const size_t end = program_.find('\n', at_);
    if (end == absl::string_view::npos) return Error("its text argument has no end of line");
    *out = program_.substr(at_, end - at_);
    at_ = end + 1;
    return absl::OkStatus();
  }
  absl::Status TakeCounted(int length_bytes, absl::string_view* out) {
    uint64_t length = 0;
    if (absl::Status s = TakeUint(length_bytes, &length); !s.ok()) return s;
    if (length > program_.size() - at_) {
      return Error(
          absl::StrCat("a value claims ", length, " bytes, ", program_.size() - at_, " remain"));
    }
    return Take(length, out);
  }

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
  absl::Status Pop(size_t n, std::vector<uint32_t>* out) {
    if (stack_.size() - Floor() < n) return Error("it takes values the stack does not hold");
    out->assign(stack_.end() - n, stack_.end());
    stack_.resize(stack_.size() - n);
    return absl::OkStatus();
  }
  // Pops everything above the innermost MARK, and the MARK.
  absl::Status PopMarked(std::vector<uint32_t>* out) {
    if (marks_.empty()) return Error("it needs a MARK and there is none");
    const size_t mark = marks_.back();
    marks_.pop_back();
    out->assign(stack_.begin() + mark, stack_.end());
    stack_.resize(mark);
    return absl::OkStatus();
  }
  // The container an APPEND(S) / SETITEM(S) adds to: the value at the top (above the
  // innermost MARK), which must be of `kind`.
  absl::Status Target(Kind kind, uint32_t* id) {
    if (stack_.size() <= Floor()) return Error("it takes values the stack does not hold");
    *id = stack_.back();
    if (Node(*id).kind != kind) {
      return Error(
          absl::StrCat("it adds to ", KindName(Node(*id).kind), ", not to ", KindName(kind)));
    }
    return absl::OkStatus();
  }

  absl::Status Memo(uint64_t id) {
    if (stack_.size() <= Floor()) return Error("it memoizes a value the stack does not hold");
    if (id > memo_.size()) {
      return Error(absl::StrCat("memo id ", id, " with ", memo_.size(), " values memoized"));
    }
    if (id == memo_.size()) {
      memo_.push_back(stack_.back());
    } else {
      memo_[id] = stack_.back();
    }
    return absl::OkStatus();
  }
  absl::Status Recall(uint64_t id) {
    if (id >= memo_.size()) {
      return Error(absl::StrCat("memo id ", id, " with ", memo_.size(), " values memoized"));
    }
    stack_.push_back(memo_[id]);
    return absl::OkStatus();
  }

  absl::Status PushInt(absl::string_view little_endian) {
    if (little_endian.size() > 8) return Error("an integer wider than 64 bits");
    uint64_t value = 0;
    for (size_t i = little_endian.size(); i-- > 0;) {
      value = (value << 8) | static_cast<uint8_t>(little_endian[i]);
    }
    // Two's complement of the stated width.
    if (!little_endian.empty() && little_endian.size() < 8 &&
        (static_cast<uint8_t>(little_endian.back()) & 0x80) != 0) {
      value |= ~uint64_t{0} << (8 * little_endian.size());
    }
    return Push(Scalar(Kind::kInt, static_cast<int64_t>(value)));
  }

  // See NOTE [LibTorch's pickle dialect].
  bool InLibTorchDialect() const {
    switch (op_) {
      case '(':
      case ')':
      case '.':
      case 'G':
      case 'J':
      case 'K':
      case 'M':
      case 'N':
      case 'Q':
      case 'R':
      case 'X':
      case ']':
      case 'b':
      case 'c':
      case 'd':
      case 'e':
      case 'h':
      case 'j':
      case 'l':
      case 'q':
      case 'r':
      case 't':
      case 'u':
      case '}':
      case 0x81:
      case 0x85:
      case 0x86:
      case 0x87:
      case 0x88:
      case 0x89:
        return true;
      case 0x80:  // PROTO
        return op_start_ == 0;
      case 0x8a:  // LONG1 of 8 bytes
        return at_ < program_.size() && program_[at_] == 8;
      default:
        return false;
    }
  }

  absl::Status Step() {
    std::vector<uint32_t> popped;
    absl::string_view text;
    uint64_t number = 0;
    if (options_.libtorch_dialect && !InLibTorchDialect()) {
      return Error("an opcode LibTorch 1.13's unpickler does not read");
    }
    switch (op_) {
      case 0x80:  // PROTO
        if (absl::Status s = TakeUint(1, &number); !s.ok()) return s;
        if (number > 5)
          return Error(absl::StrCat("pickle protocol ", number, " (5 is the latest)"));
        return absl::OkStatus();
      case 0x95:  // FRAME: a length hint
        return TakeUint(8, &number);
      case '(':  // MARK
        marks_.push_back(stack_.size());
        return absl::OkStatus();
      case '0':  // POP
        return Pop(1, &popped);
      case '1':  // POP_MARK
        return PopMarked(&popped);
      case '2':  // DUP
        if (stack_.size() <= Floor()) return Error("it takes values the stack does not hold");
        stack_.push_back(stack_.back());
        return absl::OkStatus();
      case 'N':
        return Push(Scalar(Kind::kNone));
      case 0x88:  // NEWTRUE
        return Push(Scalar(Kind::kBool, 1));
      case 0x89:  // NEWFALSE
        return Push(Scalar(Kind::kBool, 0));
      case 'J':  // BININT: signed 32 bits
        if (absl::Status s = Take(4, &text); !s.ok()) return s;
        return PushInt(text);
      case 'K':  // BININT1
        if (absl::Status s = TakeUint(1, &number); !s.ok()) return s;
        return Push(Scalar(Kind::kInt, static_cast<int64_t>(number)));
      case 'M':  // BININT2
        if (absl::Status s = TakeUint(2, &number); !s.ok()) return s;
        return Push(Scalar(Kind::kInt, static_cast<int64_t>(number)));
      case 0x8a:  // LONG1
        if (absl::Status s = TakeCounted(1, &text); !s.ok()) return s;
        return PushInt(text);
      case 0x8b:  // LONG4
        if (absl::Status s = TakeCounted(4, &text); !s.ok()) return s;
        return PushInt(text);
      case 'I': {  // INT (protocol 1 writes bools as "I01" and "I00")
        if (absl::Status s = TakeLine(&text); !s.ok()) return s;
        if (text == "01" || text == "00") return Push(Scalar(Kind::kBool, text == "01"));
        int64_t value = 0;
        if (!absl::SimpleAtoi(text, &value)) return Error("a malformed INT");
        return Push(Scalar(Kind::kInt, value));
      }
      case 'L': {  // LONG
        if (absl::Status s = TakeLine(&text); !s.ok()) return s;
        absl::ConsumeSuffix(&text, "L");
        int64_t value = 0;
        if (!absl::SimpleAtoi(text, &value)) return Error("a malformed or too large LONG");
        return Push(Scalar(Kind::kInt, value));
      }
      case 'G': {  // BINFLOAT: big-endian IEEE 754
        if (absl::Status s = Take(8, &text); !s.ok()) return s;
        uint64_t bits = 0;
        for (char c : text) bits = (bits << 8) | static_cast<uint8_t>(c);
        PickleNode node = Scalar(Kind::kFloat);
        std::memcpy(&node.float_value, &bits, sizeof(bits));
        return Push(std::move(node));
      }
      case 'X':  // BINUNICODE
      case 'T':  // BINSTRING
        if (absl::Status s = TakeCounted(4, &text); !s.ok()) return s;
        return Push(Text(Kind::kString, text));
      case 0x8c:  // SHORT_BINUNICODE
      case 'U':   // SHORT_BINSTRING
        if (absl::Status s = TakeCounted(1, &text); !s.ok()) return s;
        return Push(Text(Kind::kString, text));
      case 0x8d:  // BINUNICODE8
        if (absl::Status s = TakeCounted(8, &text); !s.ok()) return s;
        return Push(Text(Kind::kString, text));
      case 'B':  // BINBYTES
        if (absl::Status s = TakeCounted(4, &text); !s.ok()) return s;
        return Push(Text(Kind::kBytes, text));
      case 'C':  // SHORT_BINBYTES
        if (absl::Status s = TakeCounted(1, &text); !s.ok()) return s;
        return Push(Text(Kind::kBytes, text));
      case 0x8e:  // BINBYTES8
        if (absl::Status s = TakeCounted(8, &text); !s.ok()) return s;
        return Push(Text(Kind::kBytes, text));
      case ')':  // EMPTY_TUPLE
        return Push(Container(Kind::kTuple));
      case 0x85:  // TUPLE1
      case 0x86:  // TUPLE2
      case 0x87:  // TUPLE3
        if (absl::Status s = Pop(op_ - 0x84, &popped); !s.ok()) return s;
        return Push(Container(Kind::kTuple, std::move(popped)));
      case 't':  // TUPLE
        if (absl::Status s = PopMarked(&popped); !s.ok()) return s;
        return Push(Container(Kind::kTuple, std::move(popped)));
      case ']':  // EMPTY_LIST
        return Push(Container(Kind::kList));
      case 'l':  // LIST
        if (absl::Status s = PopMarked(&popped); !s.ok()) return s;
        return Push(Container(Kind::kList, std::move(popped)));
      case '}':  // EMPTY_DICT
        return Push(Container(Kind::kDict));
      case 'd':  // DICT
        if (absl::Status s = PopMarked(&popped); !s.ok()) return s;
        if (popped.size() % 2 != 0) return Error("a key without its value");
        return Push(Container(Kind::kDict, std::move(popped)));
      case 'a': {  // APPEND
        if (absl::Status s = Pop(1, &popped); !s.ok()) return s;
        uint32_t list = 0;
        if (absl::Status s = Target(Kind::kList, &list); !s.ok()) return s;
        return Extend(list, popped);
      }
      case 'e': {  // APPENDS
        if (absl::Status s = PopMarked(&popped); !s.ok()) return s;
        uint32_t list = 0;
        if (absl::Status s = Target(Kind::kList, &list); !s.ok()) return s;
        return Extend(list, popped);
      }
      case 's': {  // SETITEM
        if (absl::Status s = Pop(2, &popped); !s.ok()) return s;
        uint32_t dict = 0;
        if (absl::Status s = Target(Kind::kDict, &dict); !s.ok()) return s;
        return Extend(dict, popped);
      }
      case 'u': {  // SETITEMS
        if (absl::Status s = PopMarked(&popped); !s.ok()) return s;
        if (popped.size() % 2 != 0) return Error("a key without its value");
        uint32_t dict = 0;
        if (absl::Status s = Target(Kind::kDict, &dict); !s.ok()) return s;
        return Extend(dict, popped);
      }
      case 'q':  // BINPUT
        if (absl::Status s = TakeUint(1, &number); !s.ok()) return s;
        return Memo(number);
      case 'r':  // LONG_BINPUT
        if (absl::Status s = TakeUint(4, &number); !s.ok()) return s;
        return Memo(number);
      case 0x94:  // MEMOIZE
        return Memo(memo_.size());
      case 'h':  // BINGET
        if (absl::Status s = TakeUint(1, &number); !s.ok()) return s;
        return Recall(number);
      case 'j':  // LONG_BINGET
        if (absl::Status s = TakeUint(4, &number); !s.ok()) return s;
        return Recall(number);
      case 'c': {  // GLOBAL: "module\nname\n"
        absl::string_view module, name;
        if (absl::Status s = TakeLine(&module); !s.ok()) return s;
        if (absl::Status s = TakeLine(&name); !s.ok()) return s;
        return Push(Text(Kind::kGlobal, absl::StrCat(module, ".", name)));
      }
      case 0x93: {  // STACK_GLOBAL
        if (absl::Status s = Pop(2, &popped); !s.ok()) return s;
        if (Node(popped[0]).kind != Kind::kString || Node(popped[1]).kind != Kind::kString) {
          return Error("its module and name are not strings");
        }
        return Push(
            Text(Kind::kGlobal, absl::StrCat(Node(popped[0]).text, ".", Node(popped[1]).text)));
      }
      case 'Q':  // BINPERSID
        if (absl::Status s = Pop(1, &popped); !s.ok()) return s;
        return PersistentId(popped[0]);
      case 'R':  // REDUCE
        if (absl::Status s = Pop(2, &popped); !s.ok()) return s;
        return Reduce(popped[0], popped[1]);
      case 0x81:  // NEWOBJ
        if (absl::Status s = Pop(2, &popped); !s.ok()) return s;
        return NewObject(popped[0], popped[1]);
      case 0x92:  // NEWOBJ_EX: keyword arguments are never needed by torch.save data
        if (absl::Status s = Pop(3, &popped); !s.ok()) return s;
        return NewObject(popped[0], popped[1]);
      case 'b': {  // BUILD
        if (absl::Status s = Pop(2, &popped); !s.ok()) return s;
        PickleNode& object = Node(popped[0]);
        if (object.kind != Kind::kObject) {
          return Error(absl::StrCat("it sets the state of ", KindName(object.kind)));
        }
        object.state = popped[1];
        object.depth = std::max(object.depth, Node(popped[1]).depth + 1);
        if (object.depth > options_.max_nesting) {
          return Error(absl::StrCat("values nest deeper than ", options_.max_nesting, " levels"));
        }
        stack_.push_back(popped[0]);
        return absl::OkStatus();
      }
      case 0x8f:  // EMPTY_SET
      case 0x90:  // ADDITEMS
      case 0x91:  // FROZENSET
        return Error("a set; torch.save data holds tensors, lists, tuples and dicts");
      case 'F':
      case 'S':
      case 'V':
      case 'P':
      case 'p':
      case 'g':
      case 'i':
      case 'o':
        return Error("a text opcode of pickle protocol 0, which torch.save does not write");
      default:
        return Error("an opcode torch.save does not write");
    }
  }

  // ('storage', torch.FloatStorage, key, location, numel): NOTE [Pickled tensors].
  absl::Status PersistentId(uint32_t id) {
    const PickleNode& pid = Node(id);
    const auto& e = pid.items;
    if (pid.kind != Kind::kTuple || e.size() != 5 || Node(e[0]).kind != Kind::kString ||
        Node(e[0]).text != "storage" || Node(e[1]).kind != Kind::kGlobal ||
        Node(e[2]).kind != Kind::kString || Node(e[3]).kind != Kind::kString ||
        Node(e[4]).kind != Kind::kInt) {
      return Error(
          "a persistent id other than ('storage', torch.<Type>Storage, key, location, numel)");
    }
    absl::string_view type = Node(e[1]).text;
    PickledStorage storage;
    if (absl::ConsumePrefix(&type, "torch.") && absl::ConsumeSuffix(&type, "Storage")) {
      storage.dtype = std::string(type);
      storage.item_size = StorageItemSize(type);
    }
    if (storage.item_size == 0) {
      return Error(absl::StrCat("a storage of unknown type ", absl::CHexEscape(Node(e[1]).text)));
    }
    if (Node(e[4]).int_value < 0) return Error("a storage of negative size");
    storage.key = Node(e[2]).text;
    storage.location = Node(e[3]).text;
    storage.numel = static_cast<uint64_t>(Node(e[4]).int_value);
    // Tensors saved from one storage (`torch.save([x, x[1]])`) name its key each time, and
    // torch.load gives them one storage: a write through one shows through the others.
    const auto [known, added] =
        storage_indexes_.try_emplace(storage.key, static_cast<uint32_t>(values_.storages.size()));
    if (!added) {
      const PickledStorage& first = values_.storages[known->second];
      if (first.dtype != storage.dtype || first.numel != storage.numel) {
        return Error(absl::StrCat("storage '", absl::CHexEscape(storage.key),
                                  "' declared twice, as ", first.numel, " ", first.dtype,
                                  " and as ", storage.numel, " ", storage.dtype,
                                  " elements (torch.save declares a storage alike each time)"));
      }
    } else {
      values_.storages.push_back(std::move(storage));
    }
    PickleNode node = Scalar(Kind::kStorage);
    node.index = known->second;
    return Push(std::move(node));
  }

  // A tuple of ints (or a torch.Size, which REDUCE turns into one).
  bool IntTuple(uint32_t id, std::vector<int64_t>* out) {
    const PickleNode& node = Node(id);
    if (node.kind != Kind::kTuple) return false;
    out->clear();
    for (uint32_t item : node.items) {
      if (Node(item).kind != Kind::kInt) return false;
      out->push_back(Node(item).int_value);
    }
    return true;
  }

  // _rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks[, metadata]),
  // _rebuild_tensor(storage, offset, size, stride), _rebuild_qtensor(storage, offset,
  // size, stride, quantizer_params, requires_grad, hooks).
  absl::Status RebuildTensor(const std::vector<uint32_t>& args, absl::string_view name) {
    const bool quantized = name == "torch._utils._rebuild_qtensor";
    const bool legacy = name == "torch._utils._rebuild_tensor";
    const size_t arity = quantized ? 7 : legacy ? 4 : 6;
    if (args.size() != arity && !(name == "torch._utils._rebuild_tensor_v2" && args.size() == 7)) {
      return Error(absl::StrCat(name, " with ", args.size(), " arguments"));
    }
    PickledTensor tensor;
    if (quantized) {
      // A quantizer's scales and zero points are plain tensors. One that is itself
      // quantized makes each link of a chain of them one more level of recursion when the
      // values are built: a 2 MB file of such links overflowed the stack.
      const PickleNode& parameters = Node(args[4]);
      if (parameters.kind == Kind::kTuple) {
        for (const uint32_t item : parameters.items) {
          if (Node(item).kind == Kind::kTensor &&
              values_.tensors[Node(item).index].quantizer != kNoNode) {
            return Error(absl::StrCat(name, " whose quantizer holds a quantized tensor"));
          }
        }
      }
      tensor.quantizer = args[4];
    }
    const PickleNode& offset = Node(args[1]);
    const size_t requires_grad = quantized ? 5 : 4;
    if (Node(args[0]).kind != Kind::kStorage || offset.kind != Kind::kInt ||
        !IntTuple(args[2], &tensor.sizes) || !IntTuple(args[3], &tensor.strides) ||
        (!legacy && Node(args[requires_grad]).kind != Kind::kBool)) {
      return Error(absl::StrCat(name, " with arguments of the wrong types"));
    }
    tensor.storage = Node(args[0]).index;
    tensor.offset = offset.int_value;
    tensor.requires_grad = !legacy && Node(args[requires_grad]).int_value != 0;
    values_.tensors.push_back(std::move(tensor));
    PickleNode node = Scalar(Kind::kTensor);
    node.index = static_cast<uint32_t>(values_.tensors.size() - 1);
    return Push(std::move(node));
  }

  absl::Status Reduce(uint32_t callable, uint32_t args_id) {
    if (Node(callable).kind != Kind::kGlobal) {
      return Error(absl::StrCat("it calls ", KindName(Node(callable).kind)));
    }
    if (Node(args_id).kind != Kind::kTuple) return Error("its arguments are not a tuple");
    const std::string name = Node(callable).text;
    const std::string printable = absl::CHexEscape(name);  // for messages
    const std::vector<uint32_t> args = Node(args_id).items;
    auto arity = [&](size_t n) -> absl::Status {
      if (args.size() == n) return absl::OkStatus();
      return Error(absl::StrCat(printable, " with ", args.size(), " arguments, not ", n));
    };
    if (name == "torch._utils._rebuild_tensor_v2" || name == "torch._utils._rebuild_tensor" ||
        name == "torch._utils._rebuild_qtensor") {
      return RebuildTensor(args, name);
    }
    if (name == "torch._utils._rebuild_parameter" ||
        name == "torch._utils._rebuild_parameter_with_state") {
      // Parameter(data, requires_grad, hooks[, state]): the data tensor, requiring grad.
      if (args.size() != (name == "torch._utils._rebuild_parameter" ? 3u : 4u) ||
          Node(args[0]).kind != Kind::kTensor || Node(args[1]).kind != Kind::kBool) {
        return Error(absl::StrCat(printable, " with arguments of the wrong number or types"));
      }
      PickledTensor parameter = values_.tensors[Node(args[0]).index];
      parameter.requires_grad = Node(args[1]).int_value != 0;
      values_.tensors.push_back(std::move(parameter));
      PickleNode node = Scalar(Kind::kTensor);
      node.index = static_cast<uint32_t>(values_.tensors.size() - 1);
      return Push(std::move(node));
    }
    if (name == "collections.OrderedDict" && args.empty()) return Push(Container(Kind::kDict));
    if (name == "torch.Size") {
      if (absl::Status s = arity(1); !s.ok()) return s;
      std::vector<int64_t> dims;
      if (!IntTuple(args[0], &dims)) return Error("torch.Size of something else than ints");
      stack_.push_back(args[0]);
      return absl::OkStatus();
    }
    if (const char* type = BuiltListType(name); type != nullptr) {
      if (absl::Status s = arity(1); !s.ok()) return s;
      if (Node(args[0]).kind != Kind::kList)
        return Error(absl::StrCat(printable, " of a non-list"));
      Node(args[0]).type_tag = type;
      stack_.push_back(args[0]);
      return absl::OkStatus();
    }
    if (name == "torch.jit._pickle.restore_type_tag") {
      if (absl::Status s = arity(2); !s.ok()) return s;
      if (Node(args[1]).kind != Kind::kString) return Error("a type tag that is not a string");
      if (!PlausibleTypeTag(Node(args[1]).text)) {
        return Error(absl::StrCat("a type tag that no TorchScript type has (",
                                  Node(args[1]).text.size(), " characters; tags are at most ",
                                  kMaxTypeTagLength, " with brackets balanced and nested at most ",
                                  kMaxTypeTagNesting, " deep)"));
      }
      if (Node(args[0]).kind == Kind::kList || Node(args[0]).kind == Kind::kDict) {
        Node(args[0]).type_tag = Node(args[1]).text;
      }
      stack_.push_back(args[0]);
      return absl::OkStatus();
    }
    if (name == "builtins.complex") {
      // How LibTorch pickles a complex scalar argument (`x * 1j`): complex(real, imag).
      if (absl::Status s = arity(2); !s.ok()) return s;
      const PickleNode& real = Node(args[0]);
      const PickleNode& imag = Node(args[1]);
      const auto number = [](const PickleNode& n) {
        return n.kind == Kind::kFloat || n.kind == Kind::kInt;
      };
      if (!number(real) || !number(imag)) return Error("builtins.complex of non-numbers");
      PickleNode node = Scalar(Kind::kComplex);
      node.float_value =
          real.kind == Kind::kFloat ? real.float_value : static_cast<double>(real.int_value);
      node.imag_value =
          imag.kind == Kind::kFloat ? imag.float_value : static_cast<double>(imag.int_value);
      return Push(std::move(node));
    }
    if (name == "torch.device") {
      if (args.empty() || args.size() > 2 || Node(args[0]).kind != Kind::kString ||
          (args.size() == 2 && Node(args[1]).kind != Kind::kInt)) {
        return Error("torch.device with arguments other than (type[, index])");
      }
      std::string device = Node(args[0]).text;
      if (args.size() == 2) absl::StrAppend(&device, ":", Node(args[1]).int_value);
      return Push(Text(Kind::kDevice, device));
    }
    if (name == "torch._utils._rebuild_sparse_tensor" && !options_.allow_objects) {
      return Error("a sparse tensor, which torchlens does not read; save t.to_dense()");
    }
    return NewObject(callable, args_id);
  }

  absl::Status NewObject(uint32_t type, uint32_t args) {
    if (Node(type).kind != Kind::kGlobal) {
      return Error(absl::StrCat("it instantiates ", KindName(Node(type).kind)));
    }
    if (!options_.allow_objects) {
      return Error(absl::StrCat("an object of ", absl::CHexEscape(Node(type).text),
                                "; expected tensors, and lists, tuples and dicts of them"));
    }
    return Push(Container(Kind::kObject, {type, args}));
  }

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

}  // namespace

absl::StatusOr<PickleValues> RunPickle(absl::string_view program, const PickleOptions& options) {
  return Machine(program, options).Run();
}

}  // namespace torchlens
