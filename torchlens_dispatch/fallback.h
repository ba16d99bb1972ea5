// The boxed fallback on the capture key (see capture_key.h).
//
// Registered once, when the library is loaded, together with the write watch
// (write_watch.h). It does nothing unless a `CaptureGuard` on the calling thread included
// the capture key: other threads never reach it.
#ifndef TORCHLENS_DISPATCH_FALLBACK_H_
#define TORCHLENS_DISPATCH_FALLBACK_H_

namespace torchlens {

// Whether the fallback is registered with the dispatcher (it is, once this library is
// linked in; the call also keeps the registration from being dropped by the linker).
bool CaptureFallbackRegistered();

}  // namespace torchlens

#endif  // TORCHLENS_DISPATCH_FALLBACK_H_
