#include "graph/buffer_summary.h"

namespace torchlens {

BufferSummary SummarizeBuffer(const Buffer& buffer) {
  BufferSummary summary;
  for (const Op* version : buffer.versions) {
    summary.versions.push_back(version->label);
    if (version->buffer_write_kind.has_value()) {
      summary.write_kinds.emplace_back(WriteKindName(*version->buffer_write_kind));
    }
  }
  return summary;
}

}  // namespace torchlens
