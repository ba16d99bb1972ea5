#include "torchlens_dispatch/script_runner.h"

#include <memory>
#include <utility>

#include <torch/csrc/jit/api/function_impl.h>
#include <torch/script.h>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

namespace torchlens {
namespace {

struct PrivatePlan {
  // Holding the source graph keeps its address from being reused as another cache key.
  std::shared_ptr<torch::jit::Graph> source;
  std::unique_ptr<torch::jit::GraphFunction> function;
};

class PlanCache {
 public:
  torch::jit::GraphFunction& Get(const torch::jit::GraphFunction& method) {
    std::shared_ptr<torch::jit::Graph> source = method.graph();
    absl::MutexLock lock(&mutex_);
    PrivatePlan& plan = plans_[source.get()];
    if (plan.function == nullptr) {
      plan.source = source;
      plan.function = std::make_unique<torch::jit::GraphFunction>(
          method.qualname(), source->copy(), /*function_creator=*/nullptr,
          torch::jit::ExecutorExecutionMode::SIMPLE);
    }
    return *plan.function;
  }

 private:
  absl::Mutex mutex_;
  absl::flat_hash_map<const torch::jit::Graph*, PrivatePlan> plans_ ABSL_GUARDED_BY(mutex_);
};

PlanCache& Plans() {
  static PlanCache* cache = new PlanCache();  // never destroyed: used until exit
  return *cache;
}

}  // namespace

c10::IValue RunUnoptimized(torch::jit::Module& model, std::vector<c10::IValue> inputs,
                           const std::string& method) {
  const torch::jit::Function& function = model.get_method(method).function();
  torch::jit::GraphFunction& plan = Plans().Get(torch::jit::toGraphFunction(function));
  torch::jit::Stack stack;
  stack.reserve(inputs.size() + 1);
  stack.push_back(model._ivalue());
  for (c10::IValue& input : inputs) stack.push_back(std::move(input));
  function.getSchema().checkAndNormalizeInputs(stack, {});
  plan.run(stack);
  return stack.front();
}

}  // namespace torchlens
