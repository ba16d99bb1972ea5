#include "torchlens_dispatch/large_stack.h"

#include <pthread.h>

#include <cstring>
#include <exception>

#include "absl/strings/str_cat.h"

namespace torchlens {
namespace {

struct Work {
  absl::FunctionRef<void()> work;
  std::exception_ptr thrown;
};

void* Run(void* arg) {
  Work* work = static_cast<Work*>(arg);
  try {
    work->work();
  } catch (...) {
    work->thrown = std::current_exception();
  }
  return nullptr;
}

}  // namespace

absl::Status RunOnLargeStack(absl::FunctionRef<void()> work, size_t stack_bytes) {
  pthread_attr_t attributes;
  if (pthread_attr_init(&attributes) != 0) {
    return absl::ResourceExhaustedError("cannot describe a thread");
  }
  Work state{work, nullptr};
  pthread_t thread;
  int error = pthread_attr_setstacksize(&attributes, stack_bytes);
  if (error == 0) error = pthread_create(&thread, &attributes, &Run, &state);
  pthread_attr_destroy(&attributes);
  if (error != 0) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot start a thread with a ",
                                                     stack_bytes >> 20, " MiB stack (",
                                                     std::strerror(error), ")"));
  }
  pthread_join(thread, nullptr);
  if (state.thrown) std::rethrow_exception(state.thrown);
  return absl::OkStatus();
}

}  // namespace torchlens
