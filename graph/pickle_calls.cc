// The calls of RunPickle's machine: the globals a pickle names (NOTE [Pickled tensors] in
// graph/pickle_values.h) and the values their calls build.
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "graph/pickle_machine.h"

namespace torchlens {
namespace {

using Kind = PickleNode::Kind;

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

}  // namespace

absl::Status PickleMachine::PersistentId(uint32_t id) {
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
      return Error(absl::StrCat("storage '", absl::CHexEscape(storage.key), "' declared twice, as ",
                                first.numel, " ", first.dtype, " and as ", storage.numel, " ",
                                storage.dtype,
                                " elements (torch.save declares a storage alike each time)"));
    }
  } else {
    values_.storages.push_back(std::move(storage));
  }
  PickleNode node = Scalar(Kind::kStorage);
  node.index = known->second;
  return Push(std::move(node));
}

bool PickleMachine::IntTuple(uint32_t id, std::vector<int64_t>* out) {
  const PickleNode& node = Node(id);
  if (node.kind != Kind::kTuple) return false;
  out->clear();
  for (uint32_t item : node.items) {
    if (Node(item).kind != Kind::kInt) return false;
    out->push_back(Node(item).int_value);
  }
  return true;
}

absl::Status PickleMachine::RebuildTensor(const std::vector<uint32_t>& args,
                                          absl::string_view name) {
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

absl::Status PickleMachine::Reduce(uint32_t callable, uint32_t args_id) {
  if (Node(callable).kind != Kind::kGlobal) {
    return Error(absl::StrCat("it calls ", PickleKindName(Node(callable).kind)));
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
    if (Node(args[0]).kind != Kind::kList) return Error(absl::StrCat(printable, " of a non-list"));
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

absl::Status PickleMachine::NewObject(uint32_t type, uint32_t args) {
  if (Node(type).kind != Kind::kGlobal) {
    return Error(absl::StrCat("it instantiates ", PickleKindName(Node(type).kind)));
  }
  if (!options_.allow_objects) {
    return Error(absl::StrCat("an object of ", absl::CHexEscape(Node(type).text),
                              "; expected tensors, and lists, tuples and dicts of them"));
  }
  return Push(Container(Kind::kObject, {type, args}));
}

}  // namespace torchlens
