// Shared steps of building a ModelLayout (model_layout.h) from either model kind.
#ifndef TORCHLENS_DISPATCH_LAYOUT_BUILDER_H_
#define TORCHLENS_DISPATCH_LAYOUT_BUILDER_H_

#include <string>
#include <utility>
#include <vector>

#include "torchlens_dispatch/model_layout.h"

namespace torchlens {

// "a.b" for "a.b.weight"; "" for "weight".
std::string OwnerAddress(const std::string& address);

// Given `layout->params` (address, tensor) and `layout->buffers` (address and slot or
// tensor) and every module as (address, type name), fills in module ids, parameter ids
// and the shared trace metadata.
void FinishLayout(std::vector<std::pair<std::string, std::string>> modules, ModelLayout* layout);

}  // namespace torchlens

#endif  // TORCHLENS_DISPATCH_LAYOUT_BUILDER_H_
