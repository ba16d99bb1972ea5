// Helpers shared by the tests that capture the test models.
#ifndef TORCHLENS_TESTDATA_TRACE_TESTING_H_
#define TORCHLENS_TESTDATA_TRACE_TESTING_H_

#include <functional>
#include <string>
#include <vector>

#include "graph/trace.h"
#include "torchlens_dispatch/capture_options.h"

namespace torchlens {
namespace testing_util {

// TraceModule of testdata/NAME.pt on its generated inputs; an empty trace (and a test
// failure) when capture fails.
Trace Capture(const std::string& name, CaptureOptions options = {});

// Every node's label, in execution order.
std::vector<std::string> Labels(const Trace& trace);

// The nodes of `type` ("linear", "buffer", ...), in execution order.
std::vector<const Op*> OpsOfType(const Trace& trace, const std::string& type);

// trace.Find(key), failing the test (and returning an empty Op) when it is not found.
const Op& Get(const Trace& trace, const std::string& key);

// A copy of `trace` whose node `label` went through `change` (a tampered trace), built
// as forks are (Trace::Parts, Trace::Assemble, children recomputed from the parents);
// fails the test when there is no such node.
Trace Changed(const Trace& trace, const std::string& label, const std::function<void(Op&)>& change);

}  // namespace testing_util
}  // namespace torchlens

#endif  // TORCHLENS_TESTDATA_TRACE_TESTING_H_
