#include "torchlens_dispatch/jit_model.h"

#include <memory>
#include <string>
#include <utility>

#include <torch/csrc/jit/api/function_impl.h>
#include <torch/script.h>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace torchlens {
namespace {

using AssignedAttributes = absl::flat_hash_set<std::pair<const c10::ClassType*, std::string>>;

// (class type, attribute name) pairs assigned by prim::SetAttr anywhere in `block`.
void CollectSetAttrs(const torch::jit::Block* block, AssignedAttributes* out) {
  for (const torch::jit::Node* node : block->nodes()) {
    if (node->kind() == c10::prim::SetAttr) {
      if (auto type = node->input(0)->type()->cast<c10::ClassType>()) {
        out->emplace(type.get(), node->s(c10::attr::name));
      }
    }
    for (const torch::jit::Block* inner : node->blocks()) CollectSetAttrs(inner, out);
  }
}

// What each class type's methods assign, scanned once per type for the process: a
// capture of a model already seen costs no graph walk (see NOTE [Buffer reassignment]).
class SetAttrScans {
 public:
  void AddAssignments(const c10::ClassTypePtr& type, AssignedAttributes* out) {
    absl::MutexLock lock(&mutex_);
    Scan& scan = scans_[type.get()];
    if (scan.type == nullptr) {
      scan.type = type;  // keeps the key's address from being reused
      for (torch::jit::Function* method : type->methods()) {
        if (!method->isGraphFunction()) continue;
        CollectSetAttrs(torch::jit::toGraphFunction(*method).graph()->block(), &scan.assigned);
      }
    }
    out->insert(scan.assigned.begin(), scan.assigned.end());
  }

 private:
  struct Scan {
    c10::ClassTypePtr type;
    AssignedAttributes assigned;
  };
  absl::Mutex mutex_;
  absl::flat_hash_map<const c10::ClassType*, Scan> scans_ ABSL_GUARDED_BY(mutex_);
};

SetAttrScans& Scans() {
  static SetAttrScans* scans = new SetAttrScans();  // used until exit
  return *scans;
}

std::string Join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : absl::StrCat(prefix, ".", name);
}

std::string TypeName(const c10::ClassType& type) {
  return ShortTypeName(type.name() ? type.name()->qualifiedName() : std::string("Module"));
}

// One walk over the object tree in attribute-slot order: the same addresses as
// named_modules() / named_parameters() / named_buffers(), without their per-item cost.
void Walk(const c10::intrusive_ptr<c10::ivalue::Object>& object, const std::string& address,
          ModelState* state, AssignedAttributes* assigned) {
  const c10::ClassTypePtr type = object->type();
  Scans().AddAssignments(type, assigned);
  state->modules.push_back(ModuleHandle{address, TypeName(*type)});
  const size_t attributes = type->numAttributes();
  for (size_t slot = 0; slot < attributes; ++slot) {
    const c10::IValue& value = object->getSlot(slot);
    if (type->is_parameter(slot)) {
      if (value.isTensor()) {
        state->params.push_back(
            ParamHandle{Join(address, type->getAttributeName(slot)), address, value.toTensor()});
      }
    } else if (type->is_buffer(slot)) {
      if (value.isTensor()) {
        BufferHandle buffer;
        buffer.address = Join(address, type->getAttributeName(slot));
        buffer.module_address = address;
        buffer.tensor = value.toTensor();
        buffer.owner = object;
        buffer.slot = slot;
        state->buffers.push_back(std::move(buffer));
      }
    } else if (type->getAttribute(slot)->is_module() && value.isObject()) {
      Walk(value.toObject(), Join(address, type->getAttributeName(slot)), state, assigned);
    }
  }
}

}  // namespace

ModelState ReadModelState(const torch::jit::Module& model) {
  ModelState state;
  state.torchscript = true;
  state.training = model.is_training();
  AssignedAttributes assigned;
  Walk(model._ivalue(), "", &state, &assigned);
  for (BufferHandle& buffer : state.buffers) {
    const std::string& name = buffer.owner->type()->getAttributeName(buffer.slot);
    buffer.assigned_in_code = assigned.contains({buffer.owner->type().get(), name});
  }
  return state;
}

}  // namespace torchlens
