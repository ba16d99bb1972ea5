// The dispatch key torchlens captures on.
//
// NOTE [The capture key]
// LibTorch 1.13 has no dispatch key reserved for out-of-tree modes, and every mode-style
// key but one is taken. `TESTING_ONLY_GenericMode` is registered by nothing in libtorch;
// it sits above Autograd, so its fallback sees user-level calls (`aten::batch_norm`,
// `aten::linear`) before CompositeImplicitAutograd kernels decompose them, and it sees
// the decomposition's own calls too while the key stays in the thread's included set.
// This is the only place that names it: move it here when PyTorch offers a proper key.
#ifndef TORCHLENS_DISPATCH_OPS_CAPTURE_KEY_H_
#define TORCHLENS_DISPATCH_OPS_CAPTURE_KEY_H_

#include <c10/core/DispatchKey.h>
#include <c10/core/DispatchKeySet.h>

namespace torchlens {

constexpr c10::DispatchKey kCaptureKey = c10::DispatchKey::TESTING_ONLY_GenericMode;

// Keys strictly below the capture key: a redispatch masked with this continues to the
// kernel the call would have reached without capture.
constexpr c10::DispatchKeySet kBelowCaptureKey =
    c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kCaptureKey);

// The key of the write watch (NOTE [Watching nested writes] in write_watch.h): the one just
// below the capture key, likewise registered by nothing in libtorch but its own tests.
constexpr c10::DispatchKey kWriteWatchKey = c10::DispatchKey::TESTING_ONLY_GenericWrapper;
constexpr c10::DispatchKeySet kBelowWriteWatchKey =
    c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kWriteWatchKey);

}  // namespace torchlens

#endif  // TORCHLENS_DISPATCH_OPS_CAPTURE_KEY_H_
