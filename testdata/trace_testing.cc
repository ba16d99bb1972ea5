#include "testdata/trace_testing.h"

#include "gtest/gtest.h"
#include "testdata/testdata.h"
#include "torchlens_dispatch/capture.h"

namespace torchlens {
namespace testing_util {

Trace Capture(const std::string& name, CaptureOptions options) {
  torch::jit::Module model = testdata::LoadModel(name);
  absl::StatusOr<Trace> trace = TraceModule(model, testdata::Expected(name).inputs(), options);
  EXPECT_TRUE(trace.ok()) << name << ": " << trace.status();
  return trace.ok() ? *std::move(trace) : Trace();
}

std::vector<std::string> Labels(const Trace& trace) {
  std::vector<std::string> labels;
  for (const Op& op : trace.ops()) labels.push_back(op.label);
  return labels;
}

std::vector<const Op*> OpsOfType(const Trace& trace, const std::string& type) {
  std::vector<const Op*> ops;
  for (const Op& op : trace.ops()) {
    if (op.type == type) ops.push_back(&op);
  }
  return ops;
}

const Op& Get(const Trace& trace, const std::string& key) {
  absl::StatusOr<const Op*> op = trace.Find(key);
  EXPECT_TRUE(op.ok()) << op.status();
  static const Op kMissing;
  return op.ok() ? **op : kMissing;
}

Trace Changed(const Trace& trace, const std::string& label,
              const std::function<void(Op&)>& change) {
  TraceParts parts = trace.Parts();
  bool found = false;
  for (Op& op : parts.ops) {
    if (op.label != label) continue;
    change(op);
    found = true;
  }
  EXPECT_TRUE(found) << "no node " << label;
  parts.children_linked = false;
  return Trace::Assemble(std::move(parts));
}

}  // namespace testing_util
}  // namespace torchlens
