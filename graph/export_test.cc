// JSON export and trace files: round trips, and clear errors for bad files.
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/script.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "graph/json_export.h"
#include "graph/op_fields.h"
#include "graph/op_timing.h"
#include "graph/trace_file.h"
#include "gtest/gtest.h"
#include "testdata/testdata.h"
#include "testdata/trace_testing.h"
#include "torchlens_dispatch/capture.h"
#include "torchlens_dispatch/ops/ivalue_tensors.h"
#include "validation/intervene.h"
#include "validation/validate.h"

namespace torchlens {
namespace {

using ::torchlens::testing_util::Capture;

using ::testing::AllOf;
using ::testing::HasSubstr;

bool BitIdentical(const at::Tensor& a, const at::Tensor& b) {
  if (a.defined() != b.defined()) return false;
  return !a.defined() ||
         (a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() && at::equal(a, b));
}

std::vector<at::Tensor> ArgTensors(const Op& op) {
  std::vector<at::Tensor> tensors;
  for (const c10::IValue& arg : op.creation_args) {
    ForEachTensor(arg, [&](const at::Tensor& t) { tensors.push_back(t); });
  }
  return tensors;
}

std::string Temp(const std::string& name) { return absl::StrCat(testing::TempDir(), "/", name); }

// The bytes of `trace` saved as a trace file named `name`.
std::vector<char> SavedBytes(const Trace& trace, const std::string& name) {
  const std::string path = Temp(name);
  EXPECT_TRUE(SaveTrace(trace, path).ok());
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

TEST(TraceFileTest, RoundTripGivesAnEqualTrace) {
  for (const char* name : {"convbn_train", "seed_recurrent", "slice_copy", "dropout_train",
                           "multi_output", "counter_cell", "nested_branches", "dtype_views",
                           "conj_view", "mask_index", "complex_scalar"}) {
    SCOPED_TRACE(name);
    const Trace trace = Capture(name);
    const std::string path = Temp(absl::StrCat(name, ".trace.pt"));
    ASSERT_TRUE(SaveTrace(trace, path).ok());
    absl::StatusOr<Trace> loaded = LoadTrace(path);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    ASSERT_EQ(loaded->ops().size(), trace.ops().size());
    for (size_t i = 0; i < trace.ops().size(); ++i) {
      const Op& a = trace.ops()[i];
      const Op& b = loaded->ops()[i];
      EXPECT_EQ(a.label, b.label);
      EXPECT_EQ(a.type, b.type);
      EXPECT_EQ(a.func_name, b.func_name);
      EXPECT_EQ(a.overload_name, b.overload_name);
      EXPECT_EQ(a.parents, b.parents);
      EXPECT_EQ(a.children, b.children);
      EXPECT_EQ(a.module_address, b.module_address);
      EXPECT_EQ(a.buffer_write_kind, b.buffer_write_kind);
      EXPECT_EQ(a.buffer_value_changed, b.buffer_value_changed);
      EXPECT_EQ(a.tensor_shape, b.tensor_shape);
      EXPECT_EQ(a.parent_params, b.parent_params);
      ASSERT_EQ(a.source_position == nullptr, b.source_position == nullptr) << a.label;
      if (a.source_position != nullptr) {
        EXPECT_EQ(*a.source_position, *b.source_position) << a.label;
      }
      EXPECT_TRUE(BitIdentical(a.out, b.out)) << a.label;
      EXPECT_TRUE(BitIdentical(a.rng_state, b.rng_state)) << a.label;
      ASSERT_EQ(a.outs.size(), b.outs.size());
      for (size_t k = 0; k < a.outs.size(); ++k) EXPECT_TRUE(BitIdentical(a.outs[k], b.outs[k]));
      const std::vector<at::Tensor> args_a = ArgTensors(a);
      const std::vector<at::Tensor> args_b = ArgTensors(b);
      ASSERT_EQ(args_a.size(), args_b.size()) << a.label;
      for (size_t k = 0; k < args_a.size(); ++k) EXPECT_TRUE(BitIdentical(args_a[k], args_b[k]));
    }
    ASSERT_EQ(loaded->buffers().size(), trace.buffers().size());
    for (const auto& [address, buffer] : trace.buffers()) {
      const Buffer& other = loaded->buffers().at(address);
      EXPECT_EQ(other.versions.size(), buffer.versions.size());
      EXPECT_EQ(other.num_overwrites, buffer.num_overwrites);
      EXPECT_TRUE(BitIdentical(other.initial_value, buffer.initial_value));
      EXPECT_TRUE(BitIdentical(other.final_value, buffer.final_value));
    }
    EXPECT_EQ(loaded->modules().size(), trace.modules().size());
    EXPECT_EQ(loaded->params().size(), trace.params().size());
    // A loaded trace is as good as the captured one: it replays.
    absl::StatusOr<ValidationReport> report = ValidateForwardPass(*loaded);
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_TRUE(report->passed) << absl::StrJoin(report->failures, "\n");
  }
}

// A loaded trace takes interventions as the captured one does: `x[x > 0]`'s indices come
// back from the file as a list of tensors, which aten::index accepts as its Tensor?[].
TEST(TraceFileTest, LoadedTraceTakesInterventions) {
  const testdata::Expected expected("mask_index");
  const std::string path = Temp("mask_index_do.trace.pt");
  ASSERT_TRUE(SaveTrace(Capture("mask_index"), path).ok());
  absl::StatusOr<Trace> loaded = LoadTrace(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  absl::StatusOr<DoResult> result =
      Do(*loaded, {Edit{"input_1", expected.edit_value(0)}}, DoOptions{true});
  ASSERT_TRUE(result.ok()) << result.status();
  const std::vector<std::string> outputs = result->trace.output_labels();
  ASSERT_EQ(outputs.size(), 2u);
  for (size_t i = 0; i < outputs.size(); ++i) {
    const at::Tensor& out = result->trace.Find(outputs[i]).value()->out;
    EXPECT_TRUE(at::equal(out, expected.edit_output(0, static_cast<int>(i)))) << out;
  }
}

// NOTE [Arguments a trace file cannot hold]: a quantized model's packed parameters stay
// out of the file. Captured, every op and edge checks (quantized values are perturbed on
// their grid); read back, the quantized ops are not checked, never failed, and an edit
// that reaches one is an error naming it.
TEST(TraceFileTest, OpsWhoseArgumentsTheFileCannotHoldAreNotCheckedNeverFailed) {
  const testdata::Expected expected("quantized_net");
  const Trace captured = Capture("quantized_net");
  const std::vector<std::string> outputs = captured.output_labels();
  ASSERT_EQ(outputs.size(), 1u);
  EXPECT_TRUE(at::equal(captured.Find(outputs[0]).value()->out, expected.output(0)));
  absl::StatusOr<ValidationReport> fresh = ValidateForwardPass(captured);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_TRUE(fresh->passed) << absl::StrJoin(fresh->failures, "\n");
  EXPECT_THAT(fresh->not_checked, ::testing::IsEmpty());
  EXPECT_THAT(fresh->unproved, ::testing::IsEmpty());
  const std::string path = Temp("quantized_net.trace.pt");
  ASSERT_TRUE(SaveTrace(captured, path).ok());
  absl::StatusOr<Trace> loaded = LoadTrace(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  absl::StatusOr<ValidationReport> read_back = ValidateForwardPass(*loaded);
  ASSERT_TRUE(read_back.ok()) << read_back.status();
  EXPECT_TRUE(read_back->passed) << absl::StrJoin(read_back->failures, "\n");
  EXPECT_THAT(read_back->not_checked, ::testing::ElementsAre("conv2d_1_4:1", "linear_1_7:1"));
  const Edit edit{"input_1", at::full({2, 2, 6, 6}, 0.5)};
  EXPECT_TRUE(Do(captured, {edit}).ok());
  absl::StatusOr<DoResult> edited = Do(*loaded, {edit});
  EXPECT_EQ(edited.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(edited.status().message(), HasSubstr("conv2d_1_4:1"));
  EXPECT_THAT(edited.status().message(), HasSubstr("cannot pickle"));
}

TEST(TraceFileTest, BadFilesGiveClearErrors) {
  EXPECT_EQ(LoadTrace(Temp("missing.pt")).status().code(), absl::StatusCode::kNotFound);

  const Trace trace = Capture("mlp");
  std::vector<char> bytes = SavedBytes(trace, "mlp.trace.pt");
  for (size_t cut : {size_t{0}, size_t{10}, bytes.size() / 4, bytes.size() / 2,
                     bytes.size() * 3 / 4, bytes.size() - 100}) {
    std::vector<char> truncated(bytes.begin(), bytes.begin() + cut);
    absl::StatusOr<Trace> parsed = ParseTraceFile(truncated);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << cut;
  }
  std::vector<char> corrupt = bytes;
  for (size_t i = 100; i < corrupt.size(); i += 97) corrupt[i] ^= 0x5a;
  EXPECT_FALSE(ParseTraceFile(corrupt).ok());

  // A torch.save'd tensor, and a dict that is not a trace.
  std::ifstream tensor_file("testdata/demo_input.pt", std::ios::binary);
  std::vector<char> tensor_bytes((std::istreambuf_iterator<char>(tensor_file)),
                                 std::istreambuf_iterator<char>());
  absl::StatusOr<Trace> tensor = ParseTraceFile(tensor_bytes);
  EXPECT_EQ(tensor.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(tensor.status().message()), HasSubstr("not a dict"));

  c10::impl::GenericDict other(c10::StringType::get(), c10::AnyType::get());
  other.insert("format", std::string("torchlens.trace"));
  other.insert("version", int64_t{kTraceFileVersion + 1});
  absl::StatusOr<Trace> newer = ParseTraceFile(torch::jit::pickle_save(other));
  EXPECT_EQ(newer.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(newer.status().message()),
              HasSubstr(absl::StrCat("version ", kTraceFileVersion + 1)));
  other.insert_or_assign("version", int64_t{1});
  absl::StatusOr<Trace> incomplete = ParseTraceFile(torch::jit::pickle_save(other));
  EXPECT_EQ(incomplete.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(incomplete.status().message()), HasSubstr("has no \"training\""));
}

// A file whose parts contradict each other is refused, naming the op: a parent that is not
// an earlier op (missing, itself, later), a recorded shape or dtype that is not its saved
// value's, a label twice (helper probe, session 12: each loaded and printed what the file
// claimed, and --validate passed).
TEST(TraceFileTest, FilesWhosePartsContradictEachOtherAreRefused) {
  const Trace trace = Capture("mlp");
  const std::vector<char> bytes = SavedBytes(trace, "mlp.consistent.pt");
  ASSERT_TRUE(ParseTraceFile(bytes).ok());
  size_t saved = 1;
  while (saved < trace.ops().size() && !trace.ops()[saved].out.defined()) ++saved;
  ASSERT_LT(saved, trace.ops().size());
  const size_t last = trace.ops().size() - 1;
  struct Case {
    size_t op;
    const char* field;
    c10::IValue value;
    std::string message;
  };
  const std::string saved_label = trace.ops()[saved].label;
  const std::vector<Case> cases = {
      {saved, "parents", c10::List<std::string>({"nonexistent_9_9:1"}),
       "lists parent \"nonexistent_9_9:1\", which is not an op before it"},
      {saved, "parents", c10::List<std::string>({saved_label}),
       absl::StrCat("lists parent \"", saved_label, "\", which is not an op before it")},
      {0, "parents", c10::List<std::string>({trace.ops()[last].label}),
       "which is not an op before it"},
      {saved, "tensor_shape", c10::List<int64_t>({2, 2}),
       absl::StrCat("op \"", saved_label, "\" records shape [2, 2]")},
      {saved, "tensor_dtype", std::string("Bogus"), "dtype \"Bogus\", but its saved value"},
      {last, "label", trace.ops()[0].label,
       absl::StrCat("label \"", trace.ops()[0].label, "\" appears twice")},
      // Helper review, 2026-12-06: ints were truncated (pass 2^32 + 1 read as 1) and times
      // summed past int64.
      {saved, "pass", int64_t{(int64_t{1} << 32) + 1},
       "\"pass\" is 4294967297, outside the range of int"},
      {saved, "duration_ns", int64_t{-5}, "records start -1 ns and duration -5 ns"},
      {saved, "start_ns", int64_t{-7}, "records start -7 ns"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat(c.field, " of op ", c.op));
    c10::impl::GenericDict root = torch::jit::pickle_load(bytes).toGenericDict();
    root.at("ops").toListRef()[c.op].toGenericDict().insert_or_assign(c.field, c.value);
    absl::StatusOr<Trace> parsed = ParseTraceFile(torch::jit::pickle_save(root));
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr(c.message));
  }
}

// Module addresses are names joined by single dots, nested at most 2,048 levels in at
// most 64 KiB (helper review, 2026-12-06: an address of 200,000 levels made the summary's
// module totals and the picture's clusters quadratic, and the picture's recursion
// overflowed the stack); anything else is refused naming the op.
TEST(TraceFileTest, MalformedOrRunawayModuleAddressesAreRefused) {
  const Trace trace = Capture("mlp");
  const std::vector<char> bytes = SavedBytes(trace, "mlp.modules.pt");
  std::string deep;
  for (int i = 0; i < 2100; ++i) absl::StrAppend(&deep, i == 0 ? "" : ".", "m");
  for (const std::string& address : {std::string("fc1..relu"), std::string(".fc1"),
                                     std::string("fc1."), deep, std::string(70000, 'a')}) {
    SCOPED_TRACE(address.substr(0, 20));
    c10::impl::GenericDict root = torch::jit::pickle_load(bytes).toGenericDict();
    root.at("ops").toListRef()[1].toGenericDict().insert_or_assign("module_address", address);
    absl::StatusOr<Trace> parsed = ParseTraceFile(torch::jit::pickle_save(root));
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(parsed.status().message()),
                AllOf(HasSubstr(absl::StrCat("op \"", trace.ops()[1].label, "\"")),
                      HasSubstr("at most 2048 levels and 65536 bytes")));
  }
  // The deepest legitimate nesting loads.
  c10::impl::GenericDict root = torch::jit::pickle_load(bytes).toGenericDict();
  const std::string deepest = deep.substr(0, 2 * 2048 - 1);
  root.at("ops").toListRef()[1].toGenericDict().insert_or_assign("module_address", deepest);
  absl::StatusOr<Trace> parsed = ParseTraceFile(torch::jit::pickle_save(root));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->ops()[1].module_address, deepest);
}

// Labels, addresses and messages are whatever a file held: JSON outputs replace bytes that
// are not UTF-8 (U+FFFD) rather than throwing, which lost every output of the tool.
TEST(TraceFileTest, TextThatIsNotUtf8StillExportsAsJson) {
  const Trace trace = Capture("mlp");
  const std::vector<char> bytes = SavedBytes(trace, "mlp.utf8.pt");
  c10::impl::GenericDict root = torch::jit::pickle_load(bytes).toGenericDict();
  const size_t last = trace.ops().size() - 1;  // an output: no op names it as a parent
  root.at("ops").toListRef()[last].toGenericDict().insert_or_assign("label",
                                                                    std::string("out\xff_1"));
  absl::StatusOr<Trace> parsed = ParseTraceFile(torch::jit::pickle_save(root));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  absl::StatusOr<std::string> json = TraceToJson(*parsed);
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_THAT(*json, HasSubstr("out\xef\xbf\xbd_1"));
  EXPECT_TRUE(nlohmann::json::parse(*json).is_object());
  ValidationReport report;
  report.failures = {"relu\xfe: value mismatch"};
  EXPECT_THAT(ValidationReportToJson(report), HasSubstr("relu\xef\xbf\xbd: value mismatch"));
}

// Module totals and Chrome trace events, by hand: each module's time is its ops' and its
// submodules', and a module call spans its ops; a 2,000-level module nests as deep.
TEST(OpTimingTest, ModuleTotalsAndCallsOfHandTimedOps) {
  TraceParts parts = Capture("mlp").Parts();
  ASSERT_GE(parts.ops.size(), 5u);
  std::string deep;
  for (int i = 0; i < 2000; ++i) absl::StrAppend(&deep, i == 0 ? "" : ".", "m");
  const std::vector<std::string> addresses = {"a.b.c", "a.b", "a.d", "", deep};
  for (size_t i = 0; i < parts.ops.size(); ++i) {
    Op& op = parts.ops[i];
    op.start_ns = i < addresses.size() ? static_cast<int64_t>(100 * i) : -1;
    op.duration_ns = i < addresses.size() ? static_cast<int64_t>(10 * (i + 1)) : -1;
    op.module_address = i < addresses.size() ? addresses[i] : "";
  }
  const Trace trace = Trace::Assemble(std::move(parts));
  const std::map<std::string, int64_t> totals = ModuleTotals(trace);
  EXPECT_EQ(totals.size(), 5u + 2000u);  // "", a, a.b, a.b.c, a.d, and m ... m.m...m
  EXPECT_EQ(totals.at(""), 10 + 20 + 30 + 40 + 50);
  EXPECT_EQ(totals.at("a"), 10 + 20 + 30);
  EXPECT_EQ(totals.at("a.b"), 10 + 20);
  EXPECT_EQ(totals.at("a.b.c"), 10);
  EXPECT_EQ(totals.at("a.d"), 30);
  EXPECT_EQ(totals.at("m"), 50);
  EXPECT_EQ(totals.at(deep), 50);

  absl::StatusOr<std::string> chrome = ChromeTraceJson(trace);
  ASSERT_TRUE(chrome.ok()) << chrome.status();
  std::map<std::string, std::pair<double, double>> calls;  // module -> (ts, dur), in us
  int module_events = 0;
  const nlohmann::json parsed = nlohmann::json::parse(*chrome);
  for (const nlohmann::json& event : parsed["traceEvents"]) {
    if (event["cat"] != "module") continue;
    ++module_events;
    calls[event["name"]] = {event["ts"], event["dur"]};
  }
  // a and a.b open once for ops 0-2 (a.b closes after op 1), a.b.c and a.d once each, and
  // every level of the deep address once.
  EXPECT_EQ(module_events, 4 + 2000);
  EXPECT_EQ(calls.at("a"), std::make_pair(0.0, 0.23));    // 0 ns to op 2's end (200 + 30)
  EXPECT_EQ(calls.at("a.b"), std::make_pair(0.0, 0.12));  // to op 1's end (100 + 20)
  EXPECT_EQ(calls.at("a.b.c"), std::make_pair(0.0, 0.01));
  EXPECT_EQ(calls.at("a.d"), std::make_pair(0.2, 0.03));
  EXPECT_EQ(calls.at(deep), std::make_pair(0.4, 0.05));
}

// Version 1 files have none of the fields version 2 added (NOTE [One Op field table] says
// which); they load with those fields at their defaults, while a version 2 file without
// them is malformed.
TEST(TraceFileTest, VersionOneFilesLoadWithoutTheFieldsVersionTwoAdded) {
  const Trace trace = Capture("mlp");
  const std::vector<char> bytes = SavedBytes(trace, "mlp.v1.pt");
  c10::impl::GenericDict root = torch::jit::pickle_load(bytes).toGenericDict();
  std::vector<std::string> removed;
  const Op example;
  VisitOpFields(example, [&](const char* name, const auto&, OpField field) {
    if (field.since_version == 2) removed.push_back(name);
  });
  ASSERT_EQ(removed, (std::vector<std::string>{"alias_writes", "start_ns", "duration_ns"}));
  for (const c10::IValue& op : root.at("ops").toListRef()) {
    c10::impl::GenericDict d = op.toGenericDict();
    for (const std::string& name : removed) d.erase(name);
  }
  absl::StatusOr<Trace> as_version_2 = ParseTraceFile(torch::jit::pickle_save(root));
  EXPECT_EQ(as_version_2.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(as_version_2.status().message()),
              HasSubstr("ops[0] has no \"alias_writes\""));
  root.insert_or_assign("version", int64_t{1});
  absl::StatusOr<Trace> as_version_1 = ParseTraceFile(torch::jit::pickle_save(root));
  ASSERT_TRUE(as_version_1.ok()) << as_version_1.status();
  ASSERT_EQ(as_version_1->ops().size(), trace.ops().size());
  for (size_t i = 0; i < trace.ops().size(); ++i) {
    EXPECT_EQ(as_version_1->ops()[i].label, trace.ops()[i].label);
    EXPECT_EQ(as_version_1->ops()[i].start_ns, -1);
    EXPECT_TRUE(BitIdentical(as_version_1->ops()[i].out, trace.ops()[i].out));
  }
}

// Each JSON op holds the metadata fields of the table, in its order, then the norm of its
// gradient, and nothing else.
TEST(JsonExportTest, OpsHoldTheFieldTablesMetadata) {
  const Trace trace = Capture("slice_copy");
  absl::StatusOr<std::string> json = TraceToJson(trace);
  ASSERT_TRUE(json.ok()) << json.status();
  const nlohmann::ordered_json root = nlohmann::ordered_json::parse(*json);
  std::vector<std::string> expected;
  for (absl::string_view name : OpFieldNames(/*saved_values=*/false)) {
    expected.emplace_back(name);
  }
  EXPECT_THAT(expected, ::testing::Contains("label"));
  EXPECT_THAT(expected, ::testing::Not(::testing::Contains("out")));
  EXPECT_THAT(expected, ::testing::Not(::testing::Contains("grad")));
  expected.push_back("grad_norm");
  ASSERT_EQ(root["ops"].size(), trace.ops().size());
  for (const auto& op : root["ops"]) {
    std::vector<std::string> keys;
    for (const auto& [key, value] : op.items()) keys.push_back(key);
    EXPECT_EQ(keys, expected) << op["label"];
  }
}

// Regressions from fuzzing (NOTE [Untrusted archives]): a corrupted length field once made
// LibTorch's unpickler ask for gigabytes, and a truncated zip made its reader read past the
// buffer. Both are now clear errors before LibTorch allocates or reads.
TEST(TraceFileTest, HugeLengthFieldsAreRejectedBeforeAllocating) {
  const Trace trace = Capture("mlp");
  std::vector<char> bytes = SavedBytes(trace, "mlp.lengths.pt");
  const std::string needle = std::string("X\x06\0\0\0format", 11);
  auto at = std::search(bytes.begin(), bytes.end(), needle.begin(), needle.end());
  ASSERT_NE(at, bytes.end());
  std::vector<char> huge = bytes;
  const size_t offset = at - bytes.begin();
  huge[offset + 1] = '\x00';
  huge[offset + 4] = '\x7f';  // a string of 2 GiB
  absl::StatusOr<Trace> parsed = ParseTraceFile(huge);
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(parsed.status().message()), HasSubstr("claims"));

  std::vector<char> tail_cut(bytes.begin(), bytes.end() - 30);
  EXPECT_EQ(ParseTraceFile(tail_cut).status().code(), absl::StatusCode::kInvalidArgument);
}

// Regression from fuzzing (NOTE [Pickle stack depth]): a one-bit change turned the
// pickle's last BINGET into a MARK, so that TUPLE2 found one value where it pops two, and
// LibTorch's unpickler freed memory it never allocated.
TEST(TraceFileTest, PickleOpcodesThatPopAnEmptyStackAreRejected) {
  const Trace trace = Capture("mlp");
  std::vector<char> bytes = SavedBytes(trace, "mlp.stack.pt");
  ASSERT_TRUE(ParseTraceFile(bytes).ok());
  // The pickle ends "BINGET n, TUPLE2, REDUCE, STOP" (with "BINPUT m" before STOP when
  // the pickler memoizes the root, which it does when the root has several references).
  const std::string tail = "\x86R";
  auto at = std::find_end(bytes.begin(), bytes.end(), tail.begin(), tail.end());
  ASSERT_NE(at, bytes.end());
  ASSERT_EQ(*(at - 2), 'h');
  ASSERT_TRUE(*(at + 2) == '.' || (*(at + 2) == 'q' && *(at + 4) == '.'));
  *(at - 2) = '(';  // MARK
  *(at - 1) = '(';  // MARK
  absl::StatusOr<Trace> parsed = ParseTraceFile(bytes);
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(parsed.status().message()),
              HasSubstr("takes values the stack does not hold"));
}

// LibTorch 1.13 pickles sparse tensors as a _rebuild_sparse_tensor call Python's torch.load
// rejects ("takes 2 positional arguments but 6 were given"): refused, nothing written.
TEST(TraceFileTest, SparseTensorsAreRefusedNamingTheOp) {
  const Trace trace = Capture("sparse_output");
  const std::string path = Temp("sparse.trace.pt");
  const absl::Status saved = SaveTrace(trace, path);
  EXPECT_EQ(saved.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(saved.message()),
              HasSubstr("cannot write a trace file: op 'to_sparse_1_2:1' holds a sparse tensor"));
  EXPECT_FALSE(std::ifstream(path).good());
}

TEST(JsonExportTest, MetadataWithAVersionedSchema) {
  const Trace trace = Capture("bn2d_train");
  const nlohmann::json json = nlohmann::json::parse(*TraceToJson(trace));
  EXPECT_EQ(json["schema"], "torchlens.trace.json");
  EXPECT_EQ(json["version"], kJsonSchemaVersion);
  EXPECT_EQ(kJsonSchemaVersion, 3);
  EXPECT_EQ(json["training"], true);
  ASSERT_EQ(json["ops"].size(), trace.ops().size());
  nlohmann::json bn;
  for (const nlohmann::json& op : json["ops"]) {
    if (op["label"] == "batch_norm_1_2:1") bn = op;
  }
  ASSERT_FALSE(bn.is_null());
  EXPECT_EQ(bn["module_address"], "bn");
  EXPECT_EQ(bn["parent_params"], nlohmann::json({"bn.weight", "bn.bias"}));
  bool found_fused = false;
  for (const nlohmann::json& op : json["ops"]) {
    if (op["is_buffer"] == true && op["address"] == "bn.running_mean" && op["buffer_pass"] == 2) {
      EXPECT_EQ(op["buffer_write_kind"], "fused");
      EXPECT_EQ(op["buffer_value_changed"], true);
      EXPECT_EQ(op["parents"], nlohmann::json({"batch_norm_1_2:1"}));
      found_fused = true;
    }
  }
  EXPECT_TRUE(found_fused);
  bool found_buffer = false;
  for (const nlohmann::json& buffer : json["buffers"]) {
    if (buffer["address"] == "bn.running_var") {
      EXPECT_EQ(buffer["num_overwrites"], 1);
      EXPECT_EQ(buffer["versions"].size(), 2u);
      EXPECT_EQ(buffer["shape"], nlohmann::json({2}));
      found_buffer = true;
    }
  }
  EXPECT_TRUE(found_buffer);
  EXPECT_EQ(json["capture_stats"]["user_ops"], trace.capture_stats().user_ops);
}

}  // namespace
}  // namespace torchlens
