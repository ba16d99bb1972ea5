// Which operators change a tensor's geometry in place and no byte of its storage, for
// capture (which records no write for them) and replay (which re-runs them to remake a
// view). See NOTE [In-place view ops] in torchlens_dispatch/recorder.h.
#ifndef TORCHLENS_DISPATCH_OPS_INPLACE_VIEW_H_
#define TORCHLENS_DISPATCH_OPS_INPLACE_VIEW_H_

#include <ATen/core/dispatch/Dispatcher.h>

namespace torchlens {

// Whether the operator changes only the sizes, strides or storage offset of the argument
// its schema declares written (`t_`, `transpose_`, `squeeze_`, `unsqueeze_`, `as_strided_`,
// `detach_`): tagged `inplace_view`, except `aten::resize_`, which may allocate and leaves
// new bytes uninitialized, and so is a write.
bool IsInplaceView(const c10::OperatorHandle& op);

}  // namespace torchlens

#endif  // TORCHLENS_DISPATCH_OPS_INPLACE_VIEW_H_
