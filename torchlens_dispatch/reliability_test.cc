// Bad input, faults and faithfulness: every mistake a clear status, every fault contained.
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testdata/testdata.h"
#include "torchlens_dispatch/capture.h"
#include "torchlens_dispatch/large_stack.h"
#include "torchlens_dispatch/load_model.h"
#include "torchlens_dispatch/ops/capture_key.h"
#include "torchlens_dispatch/testing.h"
#include "validation/validate.h"

namespace torchlens {
namespace {

using ::testing::HasSubstr;

std::string Temp(const std::string& name) { return absl::StrCat(testing::TempDir(), "/", name); }

TEST(BadModelFileTest, EachProblemHasItsCodeAndNamesTheFile) {
  absl::StatusOr<torch::jit::Module> missing = LoadTorchScript(Temp("missing.pt"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("missing.pt' does not exist"));

  std::ofstream(Temp("empty.pt")).close();
  absl::StatusOr<torch::jit::Module> empty = LoadTorchScript(Temp("empty.pt"));
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(empty.status().message()), HasSubstr("is empty"));

  std::ifstream model("testdata/mlp.pt", std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(model)),
                          std::istreambuf_iterator<char>());
  std::ofstream(Temp("truncated.pt"), std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  absl::StatusOr<torch::jit::Module> truncated = LoadTorchScript(Temp("truncated.pt"));
  EXPECT_EQ(truncated.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(truncated.status().message()),
              HasSubstr("is not a valid TorchScript archive"));

  std::ofstream(Temp("text.pt")) << "def forward(x): return x\n";
  absl::StatusOr<torch::jit::Module> text = LoadTorchScript(Temp("text.pt"));
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(text.status().message()), HasSubstr("torch.jit.save"));

  absl::StatusOr<torch::jit::Module> directory = LoadTorchScript(testing::TempDir());
  EXPECT_EQ(directory.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(directory.status().message()), HasSubstr("is a directory"));
}

std::string ModelCorpus(const std::string& name) {
  return absl::StrCat("tools/fuzz/corpus/model_archive/", name);
}

// NOTE [Calls LibTorch compiles by recursion]: functions calling each other 3,000 deep
// overflowed the 8 MB main stack inside torch::jit::load (Python's too); they load on
// LoadTorchScript's large stack. (Their first forward inlines them, which LibTorch does in
// cubic time: 6 s at 1,000 deep, 3 minutes at 3,000, measured in Python; not run here.)
// 16,400 functions are refused.
TEST(BadModelFileTest, DeepCallChainsLoadOnALargeStackAndTooManyFunctionsAreRefused) {
  absl::StatusOr<torch::jit::Module> chain = LoadTorchScript(ModelCorpus("call_chain_3000.pt"));
  ASSERT_TRUE(chain.ok()) << chain.status();
  EXPECT_TRUE(chain->find_method("forward").has_value());
  absl::StatusOr<torch::jit::Module> many = LoadTorchScript(ModelCorpus("call_chain_16400.pt"));
  EXPECT_EQ(many.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(many.status().message()),
              HasSubstr("defines 16402 functions and methods, more than 4096"));
}

// The stack is as large as asked (a recursion 64 MiB deep, past the main thread's 8 MiB),
// and an exception thrown on it reaches the caller.
int Deep(int levels) {
  volatile char frame[1024];
  frame[0] = static_cast<char>(levels);
  return levels == 0 ? frame[0] : Deep(levels - 1) + 1;
}

TEST(LargeStackTest, RecursesPastTheMainStackAndRethrows) {
  int depth = 0;
  ASSERT_TRUE(RunOnLargeStack([&] { depth = Deep(64 * 1024); }).ok());
  EXPECT_EQ(depth, 64 * 1024);
  EXPECT_THROW((void)RunOnLargeStack([] { throw std::runtime_error("thrown on the large stack"); }),
               std::runtime_error);
}

// Model archives (tools/fuzz/make_corpus.py) whose data.pkl made LibTorch's unpickler pop
// values its stack does not hold ("free(): invalid size", segfaults), and parameters
// larger than their stored bytes (loaded silently, then read past their buffers).
TEST(BadModelFileTest, HostileArchivesAreRefusedBeforeLibTorchReadsThem) {
  for (const char* op : {"tuple2", "tuple3", "reduce", "build", "newobj"}) {
    const std::string path = ModelCorpus(absl::StrCat("underflow_", op, ".pt"));
    absl::StatusOr<torch::jit::Module> model = LoadTorchScript(path);
    EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument) << op;
    EXPECT_THAT(std::string(model.status().message()),
                HasSubstr(absl::StrCat("model file '", path,
                                       "' is not a valid TorchScript "
                                       "archive: underflow_",
                                       op, "/data.pkl: pickle opcode")))
        << op;
    EXPECT_THAT(std::string(model.status().message()),
                HasSubstr("takes values the stack does not hold"));
  }
  absl::StatusOr<torch::jit::Module> oversize =
      LoadTorchScript(ModelCorpus("parameter_oversize.pt"));
  EXPECT_EQ(oversize.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(oversize.status().message()),
              HasSubstr("tensor 'fc.weight' (Float, sizes [2, 4], strides [4, 1], offset 0) "
                        "reaches element 7 of its storage data/0, which holds 4 elements"));
  absl::StatusOr<torch::jit::Module> cut = LoadTorchScript(ModelCorpus("record_cut_short.pt"));
  EXPECT_EQ(cut.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(cut.status().message()),
              HasSubstr("storage data/0 of tensor 'fc.weight' claims 4 Float elements (16 "
                        "bytes), but its record holds 4 bytes"));
  // Found by fuzzing the loader: LibTorch 1.13 reads uninitialized memory for a class
  // constant without a type, and ends the process when the debug information it reads
  // while formatting an error names a global it does not know.
  absl::StatusOr<torch::jit::Module> constant =
      LoadTorchScript(ModelCorpus("class_constant_without_type.pt"));
  EXPECT_EQ(constant.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(constant.status().message()),
              HasSubstr("class Small at code/__torch__.py:3 gives '__btffers__' a value "
                        "without a type"));
  absl::StatusOr<torch::jit::Module> debug =
      LoadTorchScript(ModelCorpus("debug_info_unknown_global.pt"));
  EXPECT_EQ(debug.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(debug.status().message()),
              HasSubstr("code/__torch__.py.debug_pkl: debug information LibTorch cannot read "
                        "safely"));
  absl::StatusOr<torch::jit::Module> unprintable =
      LoadTorchScript(ModelCorpus("debug_info_unprintable.pt"));
  EXPECT_EQ(unprintable.status().code(), absl::StatusCode::kInvalidArgument);
  // Its debug record also fails its CRC, which LibTorch's reader does not check: refused
  // for that first.
  EXPECT_THAT(std::string(unprintable.status().message()),
              HasSubstr("code/__torch__.py.debug_pkl fails its CRC-32 check"));
  // crc_debug_record.pt's debug record fails its CRC too, and its zip attributes mark it a
  // directory, which makes LibTorch's reader hand out a buffer it never wrote: refused for
  // that first (debug_record_marked_directory.pt has the attribute alone).
  for (const char* file : {"crc_debug_record.pt", "debug_record_marked_directory.pt"}) {
    absl::StatusOr<torch::jit::Module> marked = LoadTorchScript(ModelCorpus(file));
    EXPECT_EQ(marked.status().code(), absl::StatusCode::kInvalidArgument) << file;
    EXPECT_THAT(std::string(marked.status().message()),
                HasSubstr("code/__torch__.py.debug_pkl is named as a file but marked as a "
                          "directory (external attributes 0x"))
        << file;
  }
  // The archive they were made from loads and runs.
  absl::StatusOr<torch::jit::Module> small = LoadTorchScript(ModelCorpus("small.pt"));
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_TRUE(TraceModule(*small, {torch::ones({1, 2})}).ok());
}

// These were "not a complete TorchScript archive": the compile error is a
// torch::jit::ErrorReport, which the c10::Error handler with the hint never saw.
TEST(BadModelFileTest, UnknownOperatorsNameTheOperatorTheLineAndWhatToLoad) {
  absl::StatusOr<torch::jit::Module> nms =
      LoadTorchScript(ModelCorpus("unknown_op_torchvision.pt"));
  EXPECT_EQ(nms.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(nms.status().message()),
              HasSubstr("uses an operator this process does not have: Unknown builtin op: "
                        "torchvision::nms. (at code/__torch__/torchvision/ops/boxes.py:"));
  EXPECT_THAT(std::string(nms.status().message()),
              HasSubstr("load the library that registers torchvision:: operators"));
  absl::StatusOr<torch::jit::Module> aten = LoadTorchScript(ModelCorpus("unknown_op_aten.pt"));
  EXPECT_EQ(aten.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(aten.status().message()),
              HasSubstr("aten::relu_of_a_newer_pytorch. (at code/__torch__.py:8: return "
                        "torch.relu_of_a_newer_pytorch(x)); this LibTorch (1.13) has no "
                        "aten::relu_of_a_newer_pytorch"));
}

// All of these printed "The following operation failed in the TorchScript interpreter."
TEST(BadInputsTest, ForwardFailuresNameTheCauseAndTheSourceLine) {
  torch::jit::Module model = testdata::LoadModel("checks_input");  // forward(x: [N, 3])
  struct Case {
    c10::IValue input;
    absl::StatusCode code;
    std::vector<std::string> expected;
  };
  const std::vector<Case> cases = {
      {torch::ones({2, 5}),
       absl::StatusCode::kInvalidArgument,
       {"forward failed on these inputs: mat1 and mat2 shapes cannot be multiplied (2x5 and 3x2) "
        "(at /usr/lib/python3/dist-packages/torch/nn/modules/linear.py:114: return "
        "F.linear(input, self.weight, self.bias))"}},
      {torch::ones({2, 3}, torch::kInt64),
       absl::StatusCode::kInvalidArgument,
       {"mat1 and mat2 must have the same dtype"}},
      {torch::ones({3}),
       absl::StatusCode::kInvalidArgument,
       {"AssertionError: expected a 2-D input (at ",
        "gen_testdata.py:", ": assert x.dim() == 2, \"expected a 2-D input\")"}},
      {torch::full({2, 3}, 50.0),
       absl::StatusCode::kInvalidArgument,
       {"ValueError: the input sums to more than 100 (at ",
        "gen_testdata.py:", ": raise ValueError(\"the input sums to more than 100\"))"}},
  };
  for (const Case& c : cases) {
    absl::StatusOr<Trace> trace = TraceModule(model, {c.input});
    EXPECT_EQ(trace.status().code(), c.code) << trace.status();
    for (const std::string& expected : c.expected) {
      EXPECT_THAT(std::string(trace.status().message()), HasSubstr(expected));
    }
    EXPECT_THAT(std::string(trace.status().message()),
                ::testing::Not(HasSubstr("The following operation failed")));
  }
  // Out of memory inside the forward: the linear layer's output of 2^40 rows.
  torch::jit::Module mlp = testdata::LoadModel("mlp");
  absl::StatusOr<Trace> huge =
      TraceModule(mlp, {torch::zeros({1, 4}).expand({int64_t{1} << 40, 4})});
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted) << huge.status();
  EXPECT_THAT(std::string(huge.status().message()),
              HasSubstr("DefaultCPUAllocator: can't allocate memory"));
  EXPECT_THAT(std::string(huge.status().message()), HasSubstr("linear.py:114: return F.linear("));
}

TEST(BadInputsTest, WrongShapeDtypeOrCountIsInvalidArgument) {
  torch::jit::Module model = testdata::LoadModel("mlp");  // forward(x: [N, 4])
  const std::vector<std::vector<c10::IValue>> bad = {
      {torch::randn({2, 5})},                        // shape
      {torch::ones({2, 4}, torch::kInt64)},          // dtype
      {torch::randn({2, 4}), torch::randn({2, 4})},  // count
      {},                                            // count
      {c10::IValue(3)},                              // not a tensor
  };
  for (size_t i = 0; i < bad.size(); ++i) {
    absl::StatusOr<Trace> trace = TraceModule(model, bad[i]);
    EXPECT_EQ(trace.status().code(), absl::StatusCode::kInvalidArgument) << i;
    EXPECT_THAT(std::string(trace.status().message()), HasSubstr("forward failed")) << i;
    EXPECT_FALSE(c10::impl::tls_is_dispatch_key_included(kCaptureKey));
  }
  // The model and the thread are fine afterwards.
  absl::StatusOr<Trace> good = TraceModule(model, testdata::Expected("mlp").inputs());
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(good->ops().size(), 5u);
}

// Throws from user code between ops (not from an op) on the third call.
struct ThrowsImpl : torch::nn::Module {
  ThrowsImpl() { counter = register_buffer("counter", torch::zeros({2})); }
  torch::Tensor forward(torch::Tensor x) {
    counter.add_(1.0);
    if (++calls == 3) throw std::runtime_error("user code failed");
    return x + counter;
  }
  int calls = 0;
  torch::Tensor counter;
};
TORCH_MODULE(Throws);

TEST(FaultsTest, ForwardThrowingFromUserCodeLeavesStateAsTheForwardLeftIt) {
  Throws net;
  net->calls = 2;
  {
    CaptureGuard guard(*net);
    EXPECT_THROW(net->forward(torch::ones({2})), std::runtime_error);
  }
  // The buffer holds what the forward wrote before it threw, nothing more.
  EXPECT_TRUE(torch::equal(net->counter, torch::ones({2})));
  EXPECT_FALSE(c10::impl::tls_is_dispatch_key_included(kCaptureKey));
  CaptureGuard guard(*net);
  const torch::Tensor out = net->forward(torch::ones({2}));
  absl::StatusOr<Trace> trace = guard.Finish(out);
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_TRUE(torch::equal(out, torch::full({2}, 3.0)));
  const Buffer& counter = trace->buffers().at("counter");
  EXPECT_TRUE(torch::equal(counter.initial_value, torch::ones({2})));
  EXPECT_TRUE(torch::equal(counter.final_value, torch::full({2}, 2.0)));
}

TEST(FaultsTest, ForwardThrowingFromAnOpLeavesBuffersAsTheForwardLeftThem) {
  // seed_recurrent's second tanh gets a shape error when x does not broadcast with h.
  torch::jit::Module model = testdata::LoadModel("raises");
  torch::jit::Module reference = testdata::LoadModel("raises");
  const at::Tensor bad = -testdata::Expected("raises").input(0);
  {
    CaptureGuard guard(model);
    EXPECT_ANY_THROW(model.forward({bad}));
    absl::StatusOr<Trace> trace = guard.Finish(c10::IValue());
    EXPECT_EQ(trace.status().code(), absl::StatusCode::kAborted);
  }
  EXPECT_ANY_THROW(reference.forward({bad}));
  for (const char* name : {"fc.weight", "fc.bias"}) {
    EXPECT_TRUE(
        torch::equal(model.attr("fc").toModule().attr(std::string(name).substr(3)).toTensor(),
                     reference.attr("fc").toModule().attr(std::string(name).substr(3)).toTensor()));
  }
  absl::StatusOr<Trace> next = TraceModule(model, testdata::Expected("raises").inputs());
  ASSERT_TRUE(next.ok()) << next.status();
  absl::StatusOr<ValidationReport> report = ValidateForwardPass(*next);
  ASSERT_TRUE(report.ok());
  EXPECT_TRUE(report->passed) << absl::StrJoin(report->failures, "\n");
}

TEST(FaultsTest, AllocationFailureWhileSavingIsAnErrorNotAHalfTrace) {
  torch::jit::Module model = testdata::LoadModel("convbn_train");
  torch::jit::Module reference = testdata::LoadModel("convbn_train");
  const std::vector<c10::IValue> inputs = testdata::Expected("convbn_train").inputs();
  at::Tensor expected;
  {
    torch::jit::GraphOptimizerEnabledGuard same_settings(false);
    expected = reference.forward(inputs).toTensor();
  }
  for (int saves : {0, 2, 4}) {
    SCOPED_TRACE(saves);
    torch::jit::Module m = testdata::LoadModel("convbn_train");
    CaptureGuard guard(m);
    FailSavesAfterForTesting(saves);
    const c10::IValue out = m.forward(inputs);
    FailSavesAfterForTesting(-1);
    absl::StatusOr<Trace> trace = guard.Finish(out);
    EXPECT_EQ(trace.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_THAT(std::string(trace.status().message()), HasSubstr("out of memory"));
    // The model computed exactly what it computes without capture.
    EXPECT_TRUE(torch::equal(out.toTensor(), expected));
    EXPECT_TRUE(torch::equal(m.attr("bn").toModule().attr("running_mean").toTensor(),
                             reference.attr("bn").toModule().attr("running_mean").toTensor()));
  }
  EXPECT_TRUE(TraceModule(model, inputs).ok());
}

// Every test model in train and eval mode: outputs, final buffers, and the parameters'
// gradients after backward() are bit-identical with and without capture.
TEST(FaithfulnessTest, CaptureNeverChangesResultsOrGradients) {
  for (const char* name :
       {"mlp",           "convbn_train",   "loop_reuse",        "multi_output",
        "call_twice",    "seed_recurrent", "recurrent_loop",    "mul_add",
        "copy_into",     "slice_copy",     "slice_assign",      "read_only",
        "add_then_mul",  "bn1d_train",     "bn2d_train",        "instancenorm_train",
        "many_buffers",  "counter_cell",   "causal_mask_bn",    "demo",
        "bn_loop_train", "dropout_train",  "inplace_activation"}) {
    for (bool train : {true, false}) {
      SCOPED_TRACE(absl::StrCat(name, train ? " train" : " eval"));
      const std::vector<c10::IValue> inputs = testdata::Expected(name).inputs();
      auto run = [&](bool capture) {
        torch::jit::Module model = testdata::LoadModel(name);
        model.train(train);
        torch::manual_seed(7);  // dropout draws the same numbers in both runs
        torch::jit::GraphOptimizerEnabledGuard same_settings(false);
        std::optional<CaptureGuard> guard;
        if (capture) guard.emplace(model);
        c10::IValue out = model.forward(inputs);
        if (capture) {
          EXPECT_TRUE(guard->Finish(out).ok());
        }
        guard.reset();
        std::vector<at::Tensor> results;
        at::Tensor loss = torch::zeros({});
        auto add = [&](const at::Tensor& t) {
          results.push_back(t.detach().clone());
          if (t.is_floating_point() && t.requires_grad()) loss = loss + t.sum();
        };
        if (out.isTensor()) add(out.toTensor());
        if (out.isTuple()) {
          for (const c10::IValue& v : out.toTupleRef().elements()) add(v.toTensor());
        }
        for (const torch::jit::NameTensor& b : model.named_buffers()) add(b.value);
        if (loss.requires_grad()) {
          try {
            loss.backward();
          } catch (const c10::Error&) {
            // inplace_activation overwrites relu's output in place: autograd refuses,
            // with and without capture alike.
            results.push_back(torch::full({1}, -12345.0));
          }
        }
        for (const torch::jit::NameTensor& p : model.named_parameters()) {
          results.push_back(p.value.grad().defined() ? p.value.grad().clone() : at::Tensor());
        }
        return results;
      };
      const std::vector<at::Tensor> plain = run(false);
      const std::vector<at::Tensor> captured = run(true);
      ASSERT_EQ(plain.size(), captured.size());
      for (size_t i = 0; i < plain.size(); ++i) {
        ASSERT_EQ(plain[i].defined(), captured[i].defined()) << i;
        if (plain[i].defined()) {
          EXPECT_TRUE(torch::equal(plain[i], captured[i])) << i;
        }
      }
    }
  }
}

TEST(LayoutTest, FollowsChangesToTheModel) {
  torch::jit::Module model = testdata::LoadModel("mlp");
  const std::vector<c10::IValue> inputs = testdata::Expected("mlp").inputs();
  ASSERT_TRUE(TraceModule(model, inputs).ok());
  // A new parameter tensor and a new buffer after the first capture.
  torch::jit::Module fc1 = model.attr("fc1").toModule();
  fc1.register_parameter("weight", torch::zeros({8, 4}), /*is_buffer=*/false);
  model.register_buffer("extra", torch::ones({1}));
  absl::StatusOr<Trace> trace = TraceModule(model, inputs);
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_EQ(trace->buffers().count("extra"), 1u);
  absl::StatusOr<const Op*> found = trace->Find("linear_1_1:1");
  ASSERT_TRUE(found.ok()) << found.status();
  const Op* linear = *found;
  ASSERT_EQ(linear->arg_sources.size(), 3u);
  EXPECT_EQ(linear->arg_sources[1].kind, ArgSource::Kind::kParam);
  EXPECT_TRUE(torch::equal(linear->creation_args[1].toTensor(), torch::zeros({8, 4})));
}

}  // namespace
}  // namespace torchlens
