// Files Python's torch.save wrote (tools/fuzz/make_corpus.py): every form of them loads
// with the values Python saved, and hostile metadata is refused naming the tensor.
#include "graph/torch_load.h"

#include <ATen/ATen.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace torchlens {
namespace {

using ::testing::HasSubstr;

constexpr char kCorpus[] = "tools/fuzz/corpus/input_file/";

std::string Corpus(const std::string& name) { return absl::StrCat(kCorpus, name); }

// What make_corpus.py saved: torch.arange(6.0).reshape(2, 3).
at::Tensor Saved() { return at::arange(6, at::kFloat).reshape({2, 3}); }

// Each protocol torch.save(..., pickle_protocol=N) writes; protocol 4 was refused as
// "unexpected pickle opcode 0x93" (STACK_GLOBAL).
TEST(LoadInputsTest, EveryPickleProtocol) {
  for (int protocol : {1, 2, 4, 5}) {
    absl::StatusOr<std::vector<c10::IValue>> inputs =
        LoadInputs(Corpus(absl::StrCat("protocol", protocol, ".pt")));
    ASSERT_TRUE(inputs.ok()) << protocol << ": " << inputs.status();
    ASSERT_EQ(inputs->size(), 1u);
    EXPECT_TRUE(at::equal((*inputs)[0].toTensor(), Saved())) << protocol;
  }
}

// torch.save([t], f) was "Unknown opcode for unpickling at 0x61" (APPEND); a saved
// nn.Parameter "truncated or corrupt?".
TEST(LoadInputsTest, ListOfOneAndParameter) {
  absl::StatusOr<std::vector<c10::IValue>> one = LoadInputs(Corpus("list_of_one.pt"));
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_EQ(one->size(), 1u);
  EXPECT_TRUE(at::equal((*one)[0].toTensor(), Saved()));

  absl::StatusOr<std::vector<c10::IValue>> parameter = LoadInputs(Corpus("parameter.pt"));
  ASSERT_TRUE(parameter.ok()) << parameter.status();
  ASSERT_EQ(parameter->size(), 1u);
  const at::Tensor p = (*parameter)[0].toTensor();
  EXPECT_TRUE(p.requires_grad());
  EXPECT_TRUE(at::equal(p.detach(), Saved()));
}

// [[t, t[0]], [t.t()]]: two arguments, each a List[Tensor]; the transposed view keeps
// its strides.
TEST(LoadInputsTest, ListOfListsAreTypedArguments) {
  absl::StatusOr<std::vector<c10::IValue>> inputs = LoadInputs(Corpus("list_of_lists.pt"));
  ASSERT_TRUE(inputs.ok()) << inputs.status();
  ASSERT_EQ(inputs->size(), 2u);
  ASSERT_TRUE((*inputs)[0].isTensorList());
  const c10::List<at::Tensor> first = (*inputs)[0].toTensorList();
  ASSERT_EQ(first.size(), 2u);
  EXPECT_TRUE(at::equal(first.get(0), Saved()));
  EXPECT_TRUE(at::equal(first.get(1), at::arange(3, at::kFloat)));
  const at::Tensor transposed = (*inputs)[1].toTensorList().get(0);
  EXPECT_EQ(transposed.sizes(), at::IntArrayRef({3, 2}));
  EXPECT_EQ(transposed.strides(), at::IntArrayRef({1, 3}));
  EXPECT_TRUE(at::equal(transposed, Saved().t()));
  // t, t[0] and t.t() were saved from one storage and share one, as torch.load gives
  // them: a write through one shows through the others.
  const at::Tensor whole = first.get(0);
  EXPECT_TRUE(whole.is_alias_of(first.get(1)));
  EXPECT_TRUE(whole.is_alias_of(transposed));
  first.get(1).add_(10);
  EXPECT_EQ(whole[0][2].item<float>(), 12.0f);
  EXPECT_EQ(transposed[2][0].item<float>(), 12.0f);
}

TEST(LoadInputsTest, AStorageDeclaredTwiceDifferentlyIsRefused) {
  absl::StatusOr<std::vector<c10::IValue>> inputs = LoadInputs(Corpus("storage_twice.pt"));
  EXPECT_EQ(inputs.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(inputs.status().message()),
              HasSubstr("storage '0' declared twice, as 6 Float and as 12 Float elements"));
}

TEST(LoadInputsTest, DictArgument) {
  absl::StatusOr<std::vector<c10::IValue>> inputs = LoadInputs(Corpus("dict_in_list.pt"));
  ASSERT_TRUE(inputs.ok()) << inputs.status();
  ASSERT_EQ(inputs->size(), 1u);
  const c10::impl::GenericDict dict = (*inputs)[0].toGenericDict();
  EXPECT_EQ(dict.at("n").toInt(), 3);
  const at::Tensor x = dict.at("x").toTensor();
  EXPECT_EQ(x.storage_offset(), 3);  // t[1:] of the saved storage
  EXPECT_TRUE(at::equal(x, at::tensor({3.0f, 4.0f, 5.0f}).reshape({1, 3})));
}

// These segfaulted (16 MB, 4 GB, offset, stride) or read heap garbage (a small overrun).
TEST(LoadInputsTest, TensorsPastTheirStorageAreRefusedNamingTheFileAndTensor) {
  for (const char* name : {"size_16mb.pt", "size_4gb.pt", "offset.pt", "stride.pt",
                           "small_overrun.pt", "negative_stride.pt", "truncated_record.pt"}) {
    absl::StatusOr<std::vector<c10::IValue>> inputs = LoadInputs(Corpus(name));
    EXPECT_EQ(inputs.status().code(), absl::StatusCode::kInvalidArgument) << name;
    const std::string message(inputs.status().message());
    EXPECT_THAT(message, HasSubstr(absl::StrCat("input file '", Corpus(name), "'"))) << name;
    EXPECT_THAT(message, HasSubstr("the saved tensor")) << name;
  }
}

// Quantized tensors as LibTorch's pickler writes them in trace files (and Python's
// torch.save alike): scheme, scale(s), zero point(s) and the integer values survive.
TEST(LoadPickledTest, QuantizedTensors) {
  const at::Tensor x = at::arange(6, at::kFloat).reshape({2, 3});
  const at::Tensor per_tensor = at::quantize_per_tensor(x, 0.5, 3, at::kQUInt8);
  const at::Tensor per_channel =
      at::quantize_per_channel(x, at::tensor({0.5, 0.25}, at::kDouble),
                               at::tensor({1, 2}, at::kLong), /*axis=*/0, at::kQInt8);
  const std::vector<char> bytes =
      torch::jit::pickle_save(c10::ivalue::Tuple::create({per_tensor, per_channel}));
  absl::StatusOr<c10::IValue> loaded = LoadPickled(absl::string_view(bytes.data(), bytes.size()));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const at::Tensor a = loaded->toTupleRef().elements()[0].toTensor();
  EXPECT_EQ(a.qscheme(), at::kPerTensorAffine);
  EXPECT_EQ(a.q_scale(), 0.5);
  EXPECT_EQ(a.q_zero_point(), 3);
  EXPECT_TRUE(at::equal(a.int_repr(), per_tensor.int_repr()));
  const at::Tensor b = loaded->toTupleRef().elements()[1].toTensor();
  EXPECT_EQ(b.qscheme(), at::kPerChannelAffine);
  EXPECT_EQ(b.q_per_channel_axis(), 0);
  EXPECT_TRUE(at::equal(b.q_per_channel_scales(), per_channel.q_per_channel_scales()));
  EXPECT_TRUE(at::equal(b.q_per_channel_zero_points(), per_channel.q_per_channel_zero_points()));
  EXPECT_TRUE(at::equal(b.int_repr(), per_channel.int_repr()));
  EXPECT_TRUE(at::equal(b.dequantize(), per_channel.dequantize()));
}

// A directory printed a raw basic_filebuf message without the path.
TEST(LoadInputsTest, DirectoryIsNamed) {
  absl::StatusOr<std::vector<c10::IValue>> inputs = LoadInputs(kCorpus);
  EXPECT_EQ(inputs.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(inputs.status().message()),
              HasSubstr(absl::StrCat("input file '", kCorpus, "' is a directory")));
}

}  // namespace
}  // namespace torchlens
