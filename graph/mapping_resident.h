// How tests see a mapping's pages given back (NOTE [Giving back a mapped value's pages] in
// graph/mapped_storage.h): the resident bytes of one mapping, as the kernel counts them.
//
//   EXPECT_LT(torchlens::ResidentBytesOfMappingAt(value.data_ptr()), kValueBytes);
#ifndef TORCHLENS_GRAPH_MAPPING_RESIDENT_H_
#define TORCHLENS_GRAPH_MAPPING_RESIDENT_H_

#include <cstdint>

namespace torchlens {

// The resident bytes ("Rss" in /proc/self/smaps) of the mapping that holds `address`; -1
// if no mapping holds it.
int64_t ResidentBytesOfMappingAt(const void* address);

}  // namespace torchlens

#endif  // TORCHLENS_GRAPH_MAPPING_RESIDENT_H_
