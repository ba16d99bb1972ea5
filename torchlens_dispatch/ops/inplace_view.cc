#include "torchlens_dispatch/ops/inplace_view.h"

#include <ATen/core/enum_tag.h>

namespace torchlens {

bool IsInplaceView(const c10::OperatorHandle& op) {
  return op.hasTag(at::Tag::inplace_view) && op.schema().name() != "aten::resize_";
}

}  // namespace torchlens
