#include "testdata/testdata.h"

#include <stdexcept>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace torchlens {
namespace testdata {

std::string ModelPath(const std::string& name) { return absl::StrCat("testdata/", name, ".pt"); }

torch::jit::Module LoadModel(const std::string& name) { return torch::jit::load(ModelPath(name)); }

const std::vector<std::string>& CoreModels() {
  static const auto* names = new std::vector<std::string>{"mlp",
                                                          "convbn_train",
                                                          "convbn_eval",
                                                          "loop_reuse",
                                                          "multi_output",
                                                          "call_twice",
                                                          "inplace_after_read",
                                                          "seed_recurrent",
                                                          "recurrent_loop",
                                                          "mul_add",
                                                          "copy_into",
                                                          "slice_copy",
                                                          "slice_assign",
                                                          "read_only",
                                                          "add_then_mul",
                                                          "return_buffer",
                                                          "bn1d_train",
                                                          "bn2d_train",
                                                          "bn2d_eval",
                                                          "instancenorm_train",
                                                          "many_buffers",
                                                          "counter_cell",
                                                          "causal_mask_bn"};
  return *names;
}

Expected::Expected(const std::string& name)
    : name_(name), values_(torch::jit::load(absl::StrCat("testdata/", name, ".expected.pt"))) {}

at::Tensor Expected::Get(const std::string& key) const {
  if (!values_.hasattr(key)) {
    throw std::out_of_range(absl::StrCat("testdata/", name_, ".expected.pt has no ", key));
  }
  return values_.attr(key).toTensor();
}

at::Tensor Expected::input(int i) const { return Get(absl::StrCat("input_", i)); }

std::vector<c10::IValue> Expected::inputs() const {
  std::vector<c10::IValue> result;
  for (int i = 0; values_.hasattr(absl::StrCat("input_", i)); ++i) result.push_back(input(i));
  return result;
}

at::Tensor Expected::output(int i) const { return Get(absl::StrCat("output_", i)); }

at::Tensor Expected::buffer(const std::string& address) const {
  return Get(absl::StrCat("buffer__", absl::StrReplaceAll(address, {{".", "__"}})));
}

at::Tensor Expected::initial_buffer(const std::string& address) const {
  return Get(absl::StrCat("initial__", absl::StrReplaceAll(address, {{".", "__"}})));
}

int Expected::source_line(const std::string& key) const {
  return static_cast<int>(Get(absl::StrCat("source_line__", key)).item<int64_t>());
}

std::string Expected::source_text(const std::string& key) const {
  const at::Tensor bytes = Get(absl::StrCat("source_text__", key)).contiguous();
  const char* data = reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>());
  return std::string(data, data + bytes.numel());
}

bool Expected::has_edit(int k) const { return values_.hasattr(absl::StrCat("edit_", k, "_value")); }

at::Tensor Expected::edit_value(int k) const { return Get(absl::StrCat("edit_", k, "_value")); }

at::Tensor Expected::edit_output(int k, int i) const {
  return Get(absl::StrCat("edit_", k, "_output_", i));
}

at::Tensor Expected::edit_buffer(int k, const std::string& address) const {
  return Get(absl::StrCat("edit_", k, "_buffer__", absl::StrReplaceAll(address, {{".", "__"}})));
}

std::vector<std::string> Expected::KeysAfter(const std::string& prefix, bool address) const {
  std::vector<std::string> keys;
  for (const torch::jit::NameTensor& entry : values_.named_buffers(/*recurse=*/false)) {
    if (entry.name.rfind(prefix, 0) != 0) continue;
    const std::string key = entry.name.substr(prefix.size());
    keys.push_back(address ? absl::StrReplaceAll(key, {{"__", "."}})
                           : absl::StrReplaceAll(key, {{"__pass", ":"}}));
  }
  return keys;
}

std::vector<std::string> Expected::grad_labels() const { return KeysAfter("grad__", false); }

at::Tensor Expected::grad(const std::string& label) const {
  return Get(absl::StrCat("grad__", absl::StrReplaceAll(label, {{":", "__pass"}})));
}

std::vector<std::string> Expected::unreached_labels() const { return KeysAfter("nograd__", false); }

std::vector<std::string> Expected::param_grad_addresses() const {
  return KeysAfter("param_grad__", true);
}

at::Tensor Expected::param_grad(const std::string& address) const {
  return Get(absl::StrCat("param_grad__", absl::StrReplaceAll(address, {{".", "__"}})));
}

}  // namespace testdata
}  // namespace torchlens
