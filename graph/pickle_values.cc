// RunPickle's opcode interpreter: the machine's stack discipline and one case per opcode
// (NOTE [Pickle stack depth], NOTE [LibTorch's pickle dialect]); the globals a program
// calls are pickle_calls.cc's.
#include "graph/pickle_values.h"

#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "graph/pickle_machine.h"

namespace torchlens {

const char* PickleKindName(PickleNode::Kind kind) {
  using Kind = PickleNode::Kind;
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

absl::StatusOr<PickleValues> PickleMachine::Run() {
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

absl::Status PickleMachine::Take(uint64_t n, absl::string_view* out) {
  if (n > program_.size() - at_) return Error("its argument runs past the end of the program");
  *out = program_.substr(at_, n);
  at_ += n;
  return absl::OkStatus();
}

absl::Status PickleMachine::TakeUint(int n, uint64_t* out) {
  absl::string_view bytes;
  if (absl::Status s = Take(n, &bytes); !s.ok()) return s;
  *out = 0;
  for (int i = n - 1; i >= 0; --i) *out = (*out << 8) | static_cast<uint8_t>(bytes[i]);
  return absl::OkStatus();
}

absl::Status PickleMachine::TakeLine(absl::string_view* out) {
  const size_t end = program_.find('\n', at_);
  if (end == absl::string_view::npos) return Error("its text argument has no end of line");
  *out = program_.substr(at_, end - at_);
  at_ = end + 1;
  return absl::OkStatus();
}

absl::Status PickleMachine::TakeCounted(int length_bytes, absl::string_view* out) {
  uint64_t length = 0;
  if (absl::Status s = TakeUint(length_bytes, &length); !s.ok()) return s;
  if (length > program_.size() - at_) {
    return Error(
        absl::StrCat("a value claims ", length, " bytes, ", program_.size() - at_, " remain"));
  }
  return Take(length, out);
}

absl::Status PickleMachine::Pop(size_t n, std::vector<uint32_t>* out) {
  if (stack_.size() - Floor() < n) return Error("it takes values the stack does not hold");
  out->assign(stack_.end() - n, stack_.end());
  stack_.resize(stack_.size() - n);
  return absl::OkStatus();
}

absl::Status PickleMachine::PopMarked(std::vector<uint32_t>* out) {
  if (marks_.empty()) return Error("it needs a MARK and there is none");
  const size_t mark = marks_.back();
  marks_.pop_back();
  out->assign(stack_.begin() + mark, stack_.end());
  stack_.resize(mark);
  return absl::OkStatus();
}

absl::Status PickleMachine::Target(Kind kind, uint32_t* id) {
  if (stack_.size() <= Floor()) return Error("it takes values the stack does not hold");
  *id = stack_.back();
  if (Node(*id).kind != kind) {
    return Error(absl::StrCat("it adds to ", PickleKindName(Node(*id).kind), ", not to ",
                              PickleKindName(kind)));
  }
  return absl::OkStatus();
}

absl::Status PickleMachine::Memo(uint64_t id) {
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

absl::Status PickleMachine::Recall(uint64_t id) {
  if (id >= memo_.size()) {
    return Error(absl::StrCat("memo id ", id, " with ", memo_.size(), " values memoized"));
  }
  stack_.push_back(memo_[id]);
  return absl::OkStatus();
}

absl::Status PickleMachine::PushInt(absl::string_view little_endian) {
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

bool PickleMachine::InLibTorchDialect() const {
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

absl::Status PickleMachine::Step() {
  std::vector<uint32_t> popped;
  absl::string_view text;
  uint64_t number = 0;
  if (options_.libtorch_dialect && !InLibTorchDialect()) {
    return Error("an opcode LibTorch 1.13's unpickler does not read");
  }
  switch (op_) {
    case 0x80:  // PROTO
      if (absl::Status s = TakeUint(1, &number); !s.ok()) return s;
      if (number > 5) return Error(absl::StrCat("pickle protocol ", number, " (5 is the latest)"));
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
        return Error(absl::StrCat("it sets the state of ", PickleKindName(object.kind)));
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

absl::StatusOr<PickleValues> RunPickle(absl::string_view program, const PickleOptions& options) {
  return PickleMachine(program, options).Run();
}

}  // namespace torchlens
