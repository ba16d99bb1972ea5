#include "graph/torch_load.h"

#include <ATen/core/Dict.h>
#include <ATen/core/List.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dynamic_type.h>
#include <ATen/core/jit_type.h>
#include <ATen/ops/_empty_affine_quantized.h>
#include <ATen/ops/_empty_per_channel_affine_quantized.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/Storage.h>
#include <c10/core/TensorImpl.h>
#include <torch/csrc/jit/mobile/type_parser.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "graph/archive_check.h"
#include "graph/file_io.h"
#include "graph/mapped_storage.h"

namespace torchlens {
namespace {

using Kind = PickleNode::Kind;

// The ScalarType of a storage class torch.<Name>Storage.
std::optional<at::ScalarType> ScalarTypeOf(absl::string_view dtype) {
  static constexpr std::pair<const char*, at::ScalarType> kTypes[] = {
      {"Byte", at::kByte},
      {"Char", at::kChar},
      {"Short", at::kShort},
      {"Int", at::kInt},
      {"Long", at::kLong},
      {"Half", at::kHalf},
      {"Float", at::kFloat},
      {"Double", at::kDouble},
      {"ComplexHalf", at::kComplexHalf},
      {"ComplexFloat", at::kComplexFloat},
      {"ComplexDouble", at::kComplexDouble},
      {"Bool", at::kBool},
      {"BFloat16", at::kBFloat16},
      {"QInt8", at::kQInt8},
      {"QUInt8", at::kQUInt8},
      {"QInt32", at::kQInt32},
  };
  for (const auto& [name, type] : kTypes) {
    if (dtype == name) return type;
  }
  return std::nullopt;
}

// A value's type as a container's element type: tensors without their shapes, lists,
// dicts and tuples by their element types.
c10::TypePtr StaticType(const c10::IValue& value) {
  if (value.isTensor()) return c10::TensorType::get();
  if (value.isList()) return c10::ListType::create(value.toList().elementType());
  if (value.isGenericDict()) {
    const c10::impl::GenericDict dict = value.toGenericDict();
    return c10::DictType::create(dict.keyType(), dict.valueType());
  }
  if (value.isTuple()) {
    std::vector<c10::TypePtr> elements;
    for (const c10::IValue& element : value.toTupleRef().elements()) {
      elements.push_back(StaticType(element));
    }
    return c10::TupleType::create(std::move(elements));
  }
  return value.type();
}

// The type all of `values` share (Tensor and None unify to Optional[Tensor]), else Any.
c10::TypePtr Unified(const std::vector<c10::IValue>& values) {
  if (values.empty()) return c10::AnyType::get();
  c10::TypePtr type = StaticType(values.front());
  for (size_t i = 1; i < values.size(); ++i) {
    c10::optional<c10::TypePtr> both = c10::unifyTypes(type, StaticType(values[i]));
    if (!both.has_value()) return c10::AnyType::get();
    type = *both;
  }
  return type;
}

// Builds the IValues of a checked torch.save archive. Shared values stay shared; the
// archive check guarantees no cycles and bounded nesting.
class Converter {
 public:
  Converter(const CheckedArchive& archive, absl::string_view bytes, std::shared_ptr<void> owner)
      : archive_(archive),
        bytes_(bytes),
        owner_(std::move(owner)),
        values_(archive.data),
        converted_(values_.nodes.size()),
        storages_(values_.storages.size()) {}

  absl::StatusOr<c10::IValue> Convert(uint32_t id, const std::string& path) {
    if (converted_[id].has_value()) return *converted_[id];
    absl::StatusOr<c10::IValue> value = Build(values_.nodes[id], path);
    if (value.ok()) converted_[id] = *value;
    return value;
  }

 private:
  absl::Status Refuse(const std::string& path, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(
        path.empty() ? std::string("the saved value") : absl::StrCat("the value at '", path, "'"),
        " is ", what, "; expected tensors, and lists, tuples and dicts of them"));
  }

  // The type a list's or dict's tag names (bounded for the parser: PlausibleTypeTag in
  // pickle_calls.cc). LibTorch's parser returns null for some names ("Union") rather
  // than throwing, and a DynamicType, which no cast to ListType or DictType matches: its
  // static equivalent is what lists are built with.
  absl::StatusOr<c10::TypePtr> Tagged(const PickleNode& node, const std::string& path) const {
    c10::TypePtr type;
    try {
      type = c10::parseType(node.type_tag);
      if (type != nullptr) {
        if (const auto* dynamic = type->castRaw<c10::DynamicType>()) type = dynamic->fallback();
      }
    } catch (const std::exception&) {
      type = nullptr;
    }
    if (type == nullptr) {
      return Refuse(path, absl::StrCat("tagged with the unknown type '",
                                       absl::CHexEscape(node.type_tag), "'"));
    }
    return type;
  }

  // A tag that its elements do not fit would give kernels a List[int] of tensors.
  absl::Status CheckTagged(const c10::TypePtr& element_type,
                           const std::vector<c10::IValue>& elements, const PickleNode& node,
                           const std::string& path) const {
    for (const c10::IValue& element : elements) {
      // An untagged empty container (List[Any]) is any list's or dict's empty value.
      if ((element.isList() && element.toListRef().empty()) ||
          (element.isGenericDict() && element.toGenericDict().empty())) {
        continue;
      }
      if (!element.type()->isSubtypeOf(*element_type)) {
        return Refuse(path,
                      absl::StrCat("tagged '", absl::CHexEscape(node.type_tag),
                                   "' but holds a value of type ", element.type()->repr_str()));
      }
    }
    return absl::OkStatus();
  }

  absl::StatusOr<at::Storage> StorageOf(uint32_t index) {
    if (storages_[index].has_value()) return *storages_[index];
    const PickledStorage& pickled = values_.storages[index];
    const ZipArchive::Entry& record = archive_.storage_records[index];
    const uint64_t bytes = pickled.numel * pickled.item_size;  // checked to fit the record
    if (owner_ != nullptr && !record.deflated && bytes > 0) {
      // LoadPickledInPlace: the storage is the record's bytes, kept mapped by `owner_`.
      // Records that torch.save and torchlens write start on 64-byte boundaries; one that
      // is not aligned for its elements is copied, as kernels may assume alignment.
      char* data = const_cast<char*>(archive_.zip.Stored(record).data());
      if (reinterpret_cast<uintptr_t>(data) % pickled.item_size == 0) {
        at::Storage storage = StorageOverMapping(data, bytes, bytes_, owner_);
        storages_[index] = storage;
        return storage;
      }
    }
    at::Storage storage(c10::Storage::use_byte_size_t(), bytes, c10::GetDefaultCPUAllocator(),
                        /*resizable=*/true);
    absl::StatusOr<std::string> inflated;
    absl::string_view data;
    if (record.deflated) {
      inflated = archive_.zip.Read(record);
      if (!inflated.ok()) return inflated.status();
      data = *inflated;
    } else {
      data = archive_.zip.Stored(record);
    }
    if (bytes > 0) std::memcpy(storage.data(), data.data(), bytes);
    storages_[index] = storage;
    return storage;
  }

  // An empty quantized tensor with the quantizer `(scheme, parameters...)` describes.
  absl::StatusOr<at::Tensor> EmptyQuantized(const PickledTensor& pickled, at::ScalarType type,
                                            const std::string& path) {
    const PickleNode& quantizer = values_.nodes[pickled.quantizer];
    const auto& q = quantizer.items;
    auto kind = [&](size_t i) { return values_.nodes[q[i]].kind; };
    const at::TensorOptions options = at::TensorOptions().dtype(type);
    if (quantizer.kind == Kind::kTuple && q.size() == 3 && kind(0) == Kind::kGlobal &&
        values_.nodes[q[0]].text == "torch.per_tensor_affine" && kind(1) == Kind::kFloat &&
        kind(2) == Kind::kInt) {
      return at::_empty_affine_quantized({0}, options, values_.nodes[q[1]].float_value,
                                         values_.nodes[q[2]].int_value);
    }
    if (quantizer.kind == Kind::kTuple && q.size() == 4 && kind(0) == Kind::kGlobal &&
        values_.nodes[q[0]].text == "torch.per_channel_affine" && kind(1) == Kind::kTensor &&
        kind(2) == Kind::kTensor && kind(3) == Kind::kInt) {
      absl::StatusOr<c10::IValue> scales = Convert(q[1], absl::StrCat(path, ".scales"));
      if (!scales.ok()) return scales.status();
      absl::StatusOr<c10::IValue> zero_points = Convert(q[2], absl::StrCat(path, ".zero_points"));
      if (!zero_points.ok()) return zero_points.status();
      return at::_empty_per_channel_affine_quantized(
          {0}, scales->toTensor(), zero_points->toTensor(), values_.nodes[q[3]].int_value, options);
    }
    return Refuse(path,
                  "a quantized tensor of a scheme other than per-tensor or per-channel "
                  "affine");
  }

  absl::StatusOr<c10::IValue> Tensor(const PickleNode& node, const std::string& path) {
    const PickledTensor& pickled = values_.tensors[node.index];
    const PickledStorage& storage = values_.storages[pickled.storage];
    const std::optional<at::ScalarType> type = ScalarTypeOf(storage.dtype);
    const bool quantized = pickled.quantizer != kNoNode;
    if (!type.has_value() || quantized != at::isQIntType(*type)) {
      return Refuse(path, absl::StrCat("a tensor of storage type ", storage.dtype,
                                       quantized ? " quantized" : ""));
    }
    absl::StatusOr<at::Storage> data = StorageOf(pickled.storage);
    if (!data.ok()) return data.status();
    at::Tensor tensor;
    if (quantized) {
      absl::StatusOr<at::Tensor> empty = EmptyQuantized(pickled, *type, path);
      if (!empty.ok()) return empty.status();
      tensor = *std::move(empty);
      tensor.unsafeGetTensorImpl()->set_storage_keep_dtype(*std::move(data));
    } else {
      tensor = at::detail::make_tensor<c10::TensorImpl>(*std::move(data),
                                                        c10::DispatchKeySet(c10::DispatchKey::CPU),
                                                        caffe2::TypeMeta::fromScalarType(*type));
    }
    tensor.unsafeGetTensorImpl()->set_sizes_and_strides(pickled.sizes, pickled.strides,
                                                        pickled.offset);
    if (pickled.requires_grad) {
      if (!at::isFloatingType(*type) && !at::isComplexType(*type)) {
        return Refuse(path, absl::StrCat("a ", storage.dtype, " tensor that requires grad"));
      }
      tensor.set_requires_grad(true);
    }
    return tensor;
  }

  absl::StatusOr<std::vector<c10::IValue>> Elements(const PickleNode& node,
                                                    const std::string& path) {
    std::vector<c10::IValue> elements;
    elements.reserve(node.items.size());
    for (size_t i = 0; i < node.items.size(); ++i) {
      absl::StatusOr<c10::IValue> element = Convert(node.items[i], absl::StrCat(path, "[", i, "]"));
      if (!element.ok()) return element.status();
      elements.push_back(*std::move(element));
    }
    return elements;
  }

  absl::StatusOr<c10::IValue> List(const PickleNode& node, const std::string& path) {
    absl::StatusOr<std::vector<c10::IValue>> elements = Elements(node, path);
    if (!elements.ok()) return elements.status();
    c10::TypePtr element_type = Unified(*elements);
    if (!node.type_tag.empty()) {
      absl::StatusOr<c10::TypePtr> tagged = Tagged(node, path);
      if (!tagged.ok()) return tagged.status();
      if (auto list = (*tagged)->cast<c10::ListType>()) {
        element_type = list->getElementType();
        if (absl::Status s = CheckTagged(element_type, *elements, node, path); !s.ok()) return s;
      }
    }
    c10::impl::GenericList list(element_type);
    list.reserve(elements->size());
    for (c10::IValue& element : *elements) list.push_back(std::move(element));
    return list;
  }

  absl::StatusOr<c10::IValue> Dict(const PickleNode& node, const std::string& path) {
    std::vector<c10::IValue> keys, values;
    for (size_t i = 0; i + 1 < node.items.size(); i += 2) {
      const PickleNode& key_node = values_.nodes[node.items[i]];
      if (key_node.kind != Kind::kString && key_node.kind != Kind::kInt &&
          key_node.kind != Kind::kFloat && key_node.kind != Kind::kBool &&
          key_node.kind != Kind::kTensor) {
        return Refuse(path, "a dict with a key that is not a string, number, bool or tensor");
      }
      absl::StatusOr<c10::IValue> key = Convert(node.items[i], path);
      if (!key.ok()) return key.status();
      const std::string step = key->isString()
                                   ? absl::StrCat("['", absl::CHexEscape(key->toStringRef()), "']")
                                   : std::string("[...]");
      absl::StatusOr<c10::IValue> value = Convert(node.items[i + 1], absl::StrCat(path, step));
      if (!value.ok()) return value.status();
      keys.push_back(*std::move(key));
      values.push_back(*std::move(value));
    }
    c10::TypePtr key_type = Unified(keys), value_type = Unified(values);
    if (!node.type_tag.empty()) {
      absl::StatusOr<c10::TypePtr> tagged = Tagged(node, path);
      if (!tagged.ok()) return tagged.status();
      if (auto dict = (*tagged)->cast<c10::DictType>()) {
        key_type = dict->getKeyType();
        value_type = dict->getValueType();
        if (absl::Status s = CheckTagged(key_type, keys, node, path); !s.ok()) return s;
        if (absl::Status s = CheckTagged(value_type, values, node, path); !s.ok()) return s;
      }
    }
    c10::impl::GenericDict dict(key_type, value_type);
    for (size_t i = 0; i < keys.size(); ++i) dict.insert_or_assign(keys[i], values[i]);
    return dict;
  }

  absl::StatusOr<c10::IValue> Build(const PickleNode& node, const std::string& path) {
    switch (node.kind) {
      case Kind::kNone:
        return c10::IValue();
      case Kind::kBool:
        return c10::IValue(node.int_value != 0);
      case Kind::kInt:
        return c10::IValue(node.int_value);
      case Kind::kFloat:
        return c10::IValue(node.float_value);
      case Kind::kComplex:
        return c10::IValue(c10::complex<double>(node.float_value, node.imag_value));
      case Kind::kString:
        return c10::IValue(node.text);
      case Kind::kTensor:
        return Tensor(node, path);
      case Kind::kTuple: {
        absl::StatusOr<std::vector<c10::IValue>> elements = Elements(node, path);
        if (!elements.ok()) return elements.status();
        return c10::ivalue::Tuple::create(*std::move(elements));
      }
      case Kind::kList:
        return List(node, path);
      case Kind::kDict:
        return Dict(node, path);
      case Kind::kDevice:
        try {
          return c10::IValue(c10::Device(node.text));
        } catch (const std::exception&) {
          return Refuse(path,
                        absl::StrCat("the unknown device '", absl::CHexEscape(node.text), "'"));
        }
      case Kind::kBytes:
        return Refuse(path, "bytes");
      case Kind::kStorage:
        return Refuse(path, "a storage (save the tensor, not its storage)");
      case Kind::kGlobal:
        return Refuse(path, absl::StrCat("a reference to ", absl::CHexEscape(node.text)));
      case Kind::kObject:
        return Refuse(path, "an object");
    }
    return Refuse(path, "an unknown value");
  }

  const CheckedArchive& archive_;
  absl::string_view bytes_;      // the whole file
  std::shared_ptr<void> owner_;  // LoadPickledInPlace's, or null
  const PickleValues& values_;
  std::vector<std::optional<c10::IValue>> converted_;
  std::vector<std::optional<at::Storage>> storages_;
};

}  // namespace

absl::StatusOr<c10::IValue> LoadPickled(absl::string_view bytes) {
  return LoadPickledInPlace(bytes, nullptr);
}

absl::StatusOr<c10::IValue> LoadPickledInPlace(absl::string_view bytes,
                                               std::shared_ptr<void> owner) {
  absl::StatusOr<CheckedArchive> checked = CheckTorchArchive(bytes, ArchiveKind::kTorchSave);
  if (!checked.ok()) return checked.status();
  // Sparse tensors are calls of torch._utils._rebuild_sparse_tensor: the machine refuses
  // them as objects, naming the call.
  try {
    return Converter(*checked, bytes, std::move(owner)).Convert(checked->data.root, "");
  } catch (const std::exception& e) {  // LibTorch refusing a value, whatever the reason
    const std::string what = e.what();
    return absl::InvalidArgumentError(
        absl::StrCat("cannot build the saved values: ", what.substr(0, what.find('\n'))));
  }
}

absl::StatusOr<c10::IValue> LoadTorchSaved(const std::string& path, absl::string_view what) {
  absl::StatusOr<FileBytes> bytes = ReadFileBytes(path, {what, "a file written by torch.save"});
  if (!bytes.ok()) return bytes.status();
  absl::StatusOr<c10::IValue> value = LoadPickled(bytes->view());
  if (!value.ok()) {
    return absl::Status(value.status().code(),
                        absl::StrCat(what, " '", path, "': ", value.status().message()));
  }
  return value;
}

absl::StatusOr<std::vector<c10::IValue>> LoadInputs(const std::string& path) {
  absl::StatusOr<c10::IValue> value = LoadTorchSaved(path, "input file");
  if (!value.ok()) return value.status();
  // An expanded tensor (stride 0) claims elements its storage does not hold, and the tool
  // copies its inputs (to compare, to edit): a few bytes of file claiming 2^40 elements
  // would be terabytes. Past the 2^31 elements an --input_shape may have, inputs must hold
  // the elements they claim.
  std::string too_large;
  value->visit([&](const c10::IValue& v) {
    if (!too_large.empty() || !v.isTensor() || !v.toTensor().defined()) return false;
    const at::Tensor& t = v.toTensor();
    constexpr int64_t kMaxExpandedElements = int64_t{1} << 31;
    if (t.numel() > kMaxExpandedElements && t.has_storage() &&
        static_cast<uint64_t>(t.numel()) * t.element_size() > t.storage().nbytes()) {
      too_large = absl::StrCat("input file '", path, "' holds a tensor of shape [",
                               absl::StrJoin(t.sizes(), ", "), "] on ", t.storage().nbytes(),
                               " bytes (an expanded tensor): more than 2^31 elements that "
                               "its storage does not hold; save it with .contiguous()");
    }
    return false;
  });
  if (!too_large.empty()) return absl::InvalidArgumentError(too_large);
  if (value->isTensor()) return std::vector<c10::IValue>{*value};
  if (value->isList()) return value->toList().vec();
  if (value->isTuple()) return value->toTupleRef().elements().vec();
  return absl::InvalidArgumentError(absl::StrCat(
      "input file '", path, "' holds a ", value->isGenericDict() ? "dict" : value->tagKind(),
      "; expected a tensor, or a list or tuple of the forward's arguments"));
}

}  // namespace torchlens
