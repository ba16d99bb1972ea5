// Loading the generated test models and their eager-PyTorch oracle values in tests.
//
//   torch::jit::Module model = torchlens::testdata::LoadModel("mlp");
//   torchlens::testdata::Expected expected("mlp");
//   at::Tensor x = expected.input(0);
//   at::Tensor y = expected.output(0);
#ifndef TORCHLENS_TESTDATA_TESTDATA_H_
#define TORCHLENS_TESTDATA_TESTDATA_H_

#include <torch/script.h>

#include <string>
#include <vector>

namespace torchlens {
namespace testdata {

// Path of testdata/NAME.pt relative to the test's working directory.
std::string ModelPath(const std::string& name);

torch::jit::Module LoadModel(const std::string& name);

// The models whose forward is deterministic and covers the buffer semantics (plain,
// loops, in-place, slice and fused writes, reassignment), in gen_testdata.py's order:
// the set every capture-wide test runs.
const std::vector<std::string>& CoreModels();

class Expected {
 public:
  explicit Expected(const std::string& name);
  at::Tensor input(int i) const;
  std::vector<c10::IValue> inputs() const;  // every input_N, in order
  at::Tensor output(int i) const;
  // A buffer's value after (buffer) or before (initial_buffer) eager PyTorch's forward.
  at::Tensor buffer(const std::string& address) const;
  at::Tensor initial_buffer(const std::string& address) const;
  // The intervention number `k` of gen_testdata.py's edits(), as eager PyTorch ran it: its
  // value, and the outputs and final buffers of the edited forward.
  bool has_edit(int k) const;
  at::Tensor edit_value(int k) const;
  at::Tensor edit_output(int k, int i) const;
  at::Tensor edit_buffer(int k, const std::string& address) const;
  // A statement of gen_testdata.py's source_markers(), as Python's `inspect` reads it:
  // its 1-based line in its file and its text without indentation.
  int source_line(const std::string& key) const;
  std::string source_text(const std::string& key) const;
  // Gradient models (tools/gen_testdata_grads.py), after a backward of the sum of the
  // outputs' sums: the labels whose gradients eager PyTorch's retain_grad() gave, each
  // node's gradient, the labels no gradient reaches, and each parameter's gradient.
  std::vector<std::string> grad_labels() const;
  at::Tensor grad(const std::string& label) const;
  std::vector<std::string> unreached_labels() const;
  std::vector<std::string> param_grad_addresses() const;
  at::Tensor param_grad(const std::string& address) const;

 private:
  at::Tensor Get(const std::string& key) const;
  // The keys starting with `prefix`, without it, decoded (see the generator).
  std::vector<std::string> KeysAfter(const std::string& prefix, bool address) const;
  std::string name_;
  torch::jit::Module values_;
};

}  // namespace testdata
}  // namespace torchlens

#endif  // TORCHLENS_TESTDATA_TESTDATA_H_
