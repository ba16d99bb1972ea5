// The write watch: a second dispatch key that sees only the calls that declare a write.
//
// NOTE [Watching nested writes]
// A user-level op that touches a buffer must have its nested calls checked for writes
// (NOTE [User-level and nested ops] in recorder.h). Keeping the capture key included for
// that sends every nested call through the boxed fallback: `linear` on a recurrent state
// is seven boxed calls (`t`, `transpose`, `as_strided`, `addmm`, `expand`, `as_strided`,
// `copy_`) where one (`copy_`) can write. Only a call whose schema declares a written
// argument can write one, and the schemas are known when this library loads. So the
// write watch key has a fallthrough fallback, which the dispatcher skips at no cost, and
// a boxed kernel for each operator that existed then and declares a written argument.
// An op whose nested calls are watched runs with the capture key excluded and the watch
// key included; the watch kernel hands each write to the recorder (`OnNestedWrite`).
//
// Kernels of operators registered later (a custom op library loaded after torchlens) may
// call other late operators, which the watch does not cover: such user-level ops keep the
// capture key included, as before (`WriteWatchCovers`). Kernels of the operators known at
// load call only operators that existed when they were built.
//
// The key is `TESTING_ONLY_GenericWrapper`, just below the capture key (capture_key.h),
// registered by nothing in libtorch but its own tests.
#ifndef TORCHLENS_DISPATCH_WRITE_WATCH_H_
#define TORCHLENS_DISPATCH_WRITE_WATCH_H_

#include <ATen/core/dispatch/Dispatcher.h>

namespace torchlens {

// Registers the watch with the dispatcher, once; later calls do nothing. Called when the
// library loads (fallback.cc), before any capture, so that no dispatch table changes while
// other threads run models.
void RegisterWriteWatch();

// Whether every operator that `op`'s kernels can call is watched for writes: `op` existed
// when the watch was registered.
bool WriteWatchCovers(const c10::OperatorHandle& op);

}  // namespace torchlens

#endif  // TORCHLENS_DISPATCH_WRITE_WATCH_H_
