// Capture that fits a service: selective saving, early stop and the memory budget
// (NOTE [Selective saving] in capture_options.h). The oracles are eager PyTorch's values
// in testdata (outputs, buffers before and after one forward) and a full capture of the
// same model, whose values the validation and capture tests check against eager PyTorch.
#include <torch/script.h>

#include <cmath>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "graph/non_finite.h"
#include "graph/trace_file.h"
#include "gtest/gtest.h"
#include "testdata/testdata.h"
#include "testdata/trace_testing.h"
#include "torchlens_dispatch/capture.h"
#include "torchlens_dispatch/ops/bit_identical.h"
#include "validation/intervene.h"
#include "validation/validate.h"

namespace torchlens {
namespace {

using ::testing::AllOf;
using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::torchlens::testing_util::Capture;
using ::torchlens::testing_util::Get;
using ::torchlens::testing_util::Labels;

// Whether module `address` is `outer` or inside it.
bool Within(const std::string& address, const std::string& outer) {
  return address == outer || address.rfind(outer + ".", 0) == 0;
}

// Checks a partly saved trace against the full capture: the same nodes, the selected ops'
// values bit-identical to the full capture's, the others without values; inputs, outputs
// and buffer versions always saved. Returns how many ops were saved.
int ExpectSavedExactly(const Trace& partial, const Trace& full,
                       const std::function<bool(const Op&)>& selected) {
  EXPECT_EQ(Labels(partial), Labels(full));
  EXPECT_TRUE(partial.has_saved_values());
  if (partial.ops().size() != full.ops().size()) return 0;
  int saved = 0;
  for (size_t i = 0; i < full.ops().size(); ++i) {
    const Op& op = partial.ops()[i];
    const Op& reference = full.ops()[i];
    if (!op.is_compute()) {
      EXPECT_TRUE(BitIdentical(op.out, reference.out)) << op.label;
      continue;
    }
    EXPECT_EQ(op.tensor_shape, reference.tensor_shape) << op.label;  // metadata stays
    if (selected(reference)) {
      ++saved;
      EXPECT_TRUE(op.saved()) << op.label;
      EXPECT_TRUE(BitIdentical(op.out, reference.out)) << op.label;
      EXPECT_EQ(op.creation_args.size(), reference.creation_args.size()) << op.label;
    } else {
      EXPECT_FALSE(op.saved()) << op.label;
      EXPECT_FALSE(op.out.defined()) << op.label;
      EXPECT_THAT(op.creation_args, IsEmpty()) << op.label;
    }
  }
  return saved;
}

// Validation checks what was saved and lists the rest, without a false failure.
void ExpectValidatesWithUnsavedListed(const Trace& partial) {
  absl::StatusOr<ValidationReport> report = ValidateForwardPass(partial);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->passed) << ::testing::PrintToString(report->failures);
  for (const Op& op : partial.ops()) {
    if (!op.is_compute()) continue;
    if (op.saved()) {
      EXPECT_THAT(report->not_checked, Not(Contains(op.label)));
    } else {
      EXPECT_THAT(report->not_checked, Contains(op.label));
    }
  }
}

TEST(SelectiveSaving, ByModuleSavesThatModuleAndEverythingUnderIt) {
  const Trace full = Capture("demo");
  CaptureOptions options;
  options.save_modules = {"block1"};
  const Trace partial = Capture("demo", options);
  const int saved = ExpectSavedExactly(
      partial, full, [](const Op& op) { return Within(op.module_address, "block1"); });
  EXPECT_GE(saved, 3);  // block1's conv, batch_norm and relu at least
  ExpectValidatesWithUnsavedListed(partial);
  // The model's result is what eager PyTorch computes.
  EXPECT_TRUE(at::allclose(Get(partial, "output_1").out, testdata::Expected("demo").output(0)));
}

TEST(SelectiveSaving, ByTypeByLabelAndByPredicate) {
  const Trace full = Capture("demo");
  {
    CaptureOptions options;
    options.save_types = {"relu"};
    const Trace partial = Capture("demo", options);
    EXPECT_EQ(ExpectSavedExactly(partial, full, [](const Op& op) { return op.type == "relu"; }),
              2);  // one in each block
    ExpectValidatesWithUnsavedListed(partial);
  }
  {
    // Labels are the same from capture to capture, so a label from one selects the same
    // op in the next.
    const std::string head = full.ops()[full.IndexOfLabel(Get(full, "output_1").parents[0])].label;
    CaptureOptions options;
    options.save_labels = {head};
    const Trace partial = Capture("demo", options);
    EXPECT_EQ(ExpectSavedExactly(partial, full, [&](const Op& op) { return op.label == head; }), 1);
    ExpectValidatesWithUnsavedListed(partial);
  }
  {
    std::vector<std::string> asked;
    CaptureOptions options;
    options.save_if = [&](const OpQuery& query) {
      asked.push_back(std::string(query.label));
      return query.module_address == "head" && query.func_name == "aten::linear";
    };
    const Trace partial = Capture("demo", options);
    EXPECT_EQ(ExpectSavedExactly(
                  partial, full,
                  [](const Op& op) { return op.module_address == "head" && op.type == "linear"; }),
              1);
    // The predicate saw every op, under the label the trace gives it.
    std::vector<std::string> compute;
    for (const Op& op : full.ops()) {
      if (op.is_compute()) compute.push_back(op.label);
    }
    EXPECT_EQ(asked, compute);
  }
}

TEST(SelectiveSaving, DoNamesTheUnsavedOpsItWouldNeedAndWorksWhereTheConeIsSaved) {
  const Trace full = Capture("demo");
  const Op& output = Get(full, "output_1");
  const Op& log_softmax = Get(full, output.parents[0]);
  const Op& linear = Get(full, log_softmax.parents[0]);
  ASSERT_EQ(linear.type, "linear");
  {
    CaptureOptions options;
    options.save_labels = {linear.label};  // log_softmax after it is not saved
    const Trace partial = Capture("demo", options);
    absl::StatusOr<DoResult> result = Do(partial, {Edit{linear.label, at::zeros_like(linear.out)}});
    EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(result.status().message()), HasSubstr(log_softmax.label));
    // An edit of a node without a saved value says why.
    absl::StatusOr<DoResult> unsaved =
        Do(partial, {Edit{log_softmax.label, at::zeros_like(log_softmax.out)}});
    EXPECT_THAT(std::string(unsaved.status().message()), HasSubstr("did not save"));
  }
  CaptureOptions options;
  options.save_labels = {linear.label, log_softmax.label};
  const Trace partial = Capture("demo", options);
  absl::StatusOr<DoResult> result = Do(partial, {Edit{linear.label, at::zeros_like(linear.out)}});
  ASSERT_TRUE(result.ok()) << result.status();
  // Hand arithmetic: log_softmax of ten zeros is -log(10) everywhere.
  EXPECT_TRUE(
      at::allclose(Get(result->trace, "output_1").out, at::full_like(output.out, -std::log(10.0))));
}

TEST(EarlyStop, HaltAfterALabelStopsThereAndLeavesBatchNormStateUntouched) {
  testdata::Expected expected("convbn_train");
  torch::jit::Module model = testdata::LoadModel("convbn_train");
  const Trace full = Capture("convbn_train");
  const Op* batch_norm = nullptr;
  for (const Op& op : full.ops()) {
    if (op.type == "batch_norm") batch_norm = &op;
  }
  ASSERT_NE(batch_norm, nullptr);
  CaptureOptions options;
  options.halt_after = batch_norm->label;
  absl::StatusOr<Trace> halted = TraceModule(model, expected.inputs(), options);
  ASSERT_TRUE(halted.ok()) << halted.status();
  EXPECT_TRUE(halted->partial());
  EXPECT_THAT(halted->partial_reason(), HasSubstr(batch_norm->label));
  // The trace is the full one up to the batch_norm, which is its last op.
  std::vector<std::string> ops;
  for (const Op& op : halted->ops()) {
    if (op.is_compute()) ops.push_back(op.label);
  }
  ASSERT_FALSE(ops.empty());
  EXPECT_EQ(ops.back(), batch_norm->label);
  EXPECT_TRUE(BitIdentical(Get(*halted, batch_norm->label).out, batch_norm->out));
  EXPECT_THAT(halted->output_labels(), IsEmpty());
  // BatchNorm ran in training mode and wrote its running statistics; the halt put them
  // back, so the model is as eager PyTorch's was before its forward.
  for (const char* address : {"bn.running_mean", "bn.running_var", "bn.num_batches_tracked"}) {
    const std::string name = std::string(address).substr(3);
    EXPECT_TRUE(at::equal(model.attr("bn").toModule().attr(name).toTensor(),
                          expected.initial_buffer(address)))
        << address;
  }
  // The next forward computes, and leaves, exactly what eager PyTorch's first did.
  const at::Tensor out = model.forward(expected.inputs()).toTensor();
  EXPECT_TRUE(at::allclose(out, expected.output(0), 1e-5, 1e-6));
  for (const char* address : {"bn.running_mean", "bn.running_var", "bn.num_batches_tracked"}) {
    const std::string name = std::string(address).substr(3);
    EXPECT_TRUE(at::allclose(model.attr("bn").toModule().attr(name).toTensor(),
                             expected.buffer(address), 1e-5, 1e-6))
        << address;
  }
  // What was saved validates.
  absl::StatusOr<ValidationReport> report = ValidateForwardPass(*halted);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->passed) << ::testing::PrintToString(report->failures);
}

TEST(EarlyStop, HaltAfterAModuleStopsWhenItHasFinished) {
  testdata::Expected expected("demo");
  torch::jit::Module model = testdata::LoadModel("demo");
  CaptureOptions options;
  options.halt_after = "block1";
  absl::StatusOr<Trace> halted = TraceModule(model, expected.inputs(), options);
  ASSERT_TRUE(halted.ok()) << halted.status();
  EXPECT_TRUE(halted->partial());
  EXPECT_THAT(halted->partial_reason(), HasSubstr("block1"));
  bool ran_block1 = false;
  for (const Op& op : halted->ops()) {
    ran_block1 = ran_block1 || Within(op.module_address, "block1");
    EXPECT_FALSE(Within(op.module_address, "block2")) << op.label;
    EXPECT_FALSE(Within(op.module_address, "head")) << op.label;
  }
  EXPECT_TRUE(ran_block1);
  // `calls.add_(1)` ran first; the halt restored it.
  EXPECT_TRUE(at::equal(model.attr("calls").toTensor(), expected.initial_buffer("calls")));
  EXPECT_TRUE(at::allclose(model.forward(expected.inputs()).toTensor(), expected.output(0)));
  EXPECT_TRUE(at::equal(model.attr("calls").toTensor(), expected.buffer("calls")));
}

// NOTE [Parameters restored after a halt]: param_view_writes writes its parameters
// through views before its second linear; a halt after that linear puts them back, with
// or without saved values.
TEST(EarlyStop, AHaltRestoresParametersTheForwardWrote) {
  testdata::Expected expected("param_view_writes");
  const Trace full = Capture("param_view_writes");
  std::string second_linear;
  for (const Op& op : full.ops()) {
    if (op.type == "linear") second_linear = op.label;
  }
  for (const bool save : {true, false}) {
    SCOPED_TRACE(save ? "saved" : "unsaved");
    torch::jit::Module model = testdata::LoadModel("param_view_writes");
    const torch::jit::Module untouched = testdata::LoadModel("param_view_writes");
    CaptureOptions options;
    options.save_activations = save;
    options.halt_after = second_linear;
    absl::StatusOr<Trace> halted = TraceModule(model, expected.inputs(), options);
    ASSERT_TRUE(halted.ok()) << halted.status();
    EXPECT_TRUE(halted->partial());
    const auto params = model.named_parameters();
    const auto initial = untouched.named_parameters();
    auto it = initial.begin();
    for (const auto& param : params) {
      EXPECT_TRUE(at::equal(param.value, (*it).value)) << param.name;
      ++it;
    }
    // The next forward computes what eager PyTorch's first did.
    const c10::IValue out = model.forward(expected.inputs());
    EXPECT_TRUE(
        at::allclose(out.toTuple()->elements()[0].toTensor(), expected.output(0), 1e-5, 1e-6));
    if (save) {
      absl::StatusOr<ValidationReport> report = ValidateForwardPass(*halted);
      ASSERT_TRUE(report.ok()) << report.status();
      EXPECT_TRUE(report->passed) << ::testing::PrintToString(report->failures);
    }
  }
}

TEST(EarlyStop, StopAtNonFiniteHaltsAtTheFirstOpThatMadeNaNOrInf) {
  testdata::Expected expected("divide_by_zero");
  const Trace full = Capture("divide_by_zero");
  absl::StatusOr<std::optional<NonFinite>> first = FirstNonFinite(full);
  ASSERT_TRUE(first.ok() && first->has_value()) << first.status();
  torch::jit::Module model = testdata::LoadModel("divide_by_zero");
  CaptureOptions options;
  options.stop_at_non_finite = true;
  absl::StatusOr<Trace> halted = TraceModule(model, expected.inputs(), options);
  ASSERT_TRUE(halted.ok()) << halted.status();
  EXPECT_TRUE(halted->partial());
  EXPECT_THAT(halted->partial_reason(), HasSubstr((*first)->label));
  const Op& last = halted->ops().back();
  EXPECT_EQ(last.label, (*first)->label);
  EXPECT_TRUE(BitIdentical(last.out, Get(full, last.label).out));
  // A model without NaN or Inf runs to the end, and its trace is complete.
  options.stop_at_non_finite = true;
  const Trace demo = Capture("demo", options);
  EXPECT_FALSE(demo.partial());
  EXPECT_THAT(demo.output_labels(), Not(IsEmpty()));
}

TEST(EarlyStop, AnUnknownHaltTargetIsAnError) {
  CaptureOptions options;
  options.halt_after = "no_such_module";
  torch::jit::Module model = testdata::LoadModel("demo");
  absl::StatusOr<Trace> trace = TraceModule(model, testdata::Expected("demo").inputs(), options);
  EXPECT_EQ(trace.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(trace.status().message()), HasSubstr("no_such_module"));
  // So is a module to save that the model does not have.
  CaptureOptions save_unknown;
  save_unknown.save_modules = {"block1", "no_such_block"};
  trace = TraceModule(model, testdata::Expected("demo").inputs(), save_unknown);
  EXPECT_EQ(trace.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(trace.status().message()),
              AllOf(HasSubstr("save_modules names \"no_such_block\""),
                    HasSubstr("not a module address of this model")));
  // A label no op has (a pass that never ran, a misspelt one) is found out at the end: the
  // forward ran whole, which a trace must not pass off as the halted one.
  for (const char* label : {"relu_1_5:x", "relu_9_9:1", "relu_1_5:2", ":"}) {
    SCOPED_TRACE(label);
    options.halt_after = label;
    trace = TraceModule(model, testdata::Expected("demo").inputs(), options);
    EXPECT_EQ(trace.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(trace.status().message()),
                AllOf(HasSubstr(label), HasSubstr("no op of this forward had that label")));
  }
}

TEST(MemoryBudget, ExceedingItIsAnErrorOrAPartialTraceAndTheResultIsUnchanged) {
  testdata::Expected expected("demo");
  for (const bool partial_on_budget : {false, true}) {
    SCOPED_TRACE(partial_on_budget);
    torch::jit::Module model = testdata::LoadModel("demo");
    CaptureOptions options;
    options.max_saved_bytes = 4096;  // a few of the demo's activations
    options.partial_on_budget = partial_on_budget;
    CaptureGuard guard(model, options);
    const c10::IValue out = model.forward(expected.inputs());
    absl::StatusOr<Trace> trace = guard.Finish(out);
    EXPECT_TRUE(at::allclose(out.toTensor(), expected.output(0)));
    EXPECT_TRUE(at::equal(model.attr("calls").toTensor(), expected.buffer("calls")));
    if (!partial_on_budget) {
      EXPECT_EQ(trace.status().code(), absl::StatusCode::kResourceExhausted);
      EXPECT_THAT(std::string(trace.status().message()), HasSubstr("max_saved_bytes"));
      EXPECT_THAT(std::string(trace.status().message()), HasSubstr("saving stopped at "));
      continue;
    }
    ASSERT_TRUE(trace.ok()) << trace.status();
    EXPECT_TRUE(trace->partial());
    int saved = 0, unsaved = 0;
    for (const Op& op : trace->ops()) {
      if (!op.is_compute()) continue;
      (op.saved() ? saved : unsaved) += 1;
    }
    EXPECT_GT(saved, 0);
    EXPECT_GT(unsaved, 0);
    ExpectValidatesWithUnsavedListed(*trace);
    // The reason survives a trace file.
    const std::string path = ::testing::TempDir() + "/budget.trace.pt";
    ASSERT_TRUE(SaveTrace(*trace, path).ok());
    absl::StatusOr<Trace> loaded = LoadTrace(path);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_EQ(loaded->partial_reason(), trace->partial_reason());
  }
}

}  // namespace
}  // namespace torchlens
