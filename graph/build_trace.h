// Turning a finished capture record into a labelled `Trace`.
//
// The trace's graph is built when it is first read (NOTE [Graphs built on first use] in
// trace.h), once: that names nodes (see trace.h for the label scheme), resolves record
// indexes into labels and rebuilds each op's saved arguments from the saved tensor values.
// Until then the trace holds `record`.
#ifndef TORCHLENS_GRAPH_BUILD_TRACE_H_
#define TORCHLENS_GRAPH_BUILD_TRACE_H_

#include "graph/capture_record.h"
#include "graph/trace.h"

namespace torchlens {

Trace BuildTrace(CaptureRecord record);

}  // namespace torchlens

#endif  // TORCHLENS_GRAPH_BUILD_TRACE_H_
