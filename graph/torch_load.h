// Reading what Python's `torch.save` wrote: torchlens' own reader, not LibTorch's.
//
//   absl::StatusOr<std::vector<c10::IValue>> inputs = torchlens::LoadInputs("inputs.pt");
//   absl::StatusOr<c10::IValue> value = torchlens::LoadTorchSaved("values.pt");
//
// The bytes are checked first (archive_check.h: the zip container, the pickle program,
// every tensor against its storage), then turned into IValues by torchlens itself, so
// that LibTorch's unpickler never interprets an untrusted data file. That also reads what
// LibTorch 1.13's unpickler refuses: any pickle protocol `torch.save(...,
// pickle_protocol=N)` writes (1 to 5), one-element lists (`torch.save([t], f)`), dicts,
// lists of lists, and `nn.Parameter`s (loaded as tensors that require grad). Tensors come
// back on the CPU, in new storages: a tensor never aliases the file's bytes. Tensors saved
// from one storage (`torch.save([x, x[1]])`) share one, as torch.load gives them. Lists and
// dicts get the element type their values share (`List[Tensor]`, `List[List[Tensor]]`),
// or the type a TorchScript pickler recorded for them. Quantized tensors of per-tensor or
// per-channel affine schemes load as such. Sparse tensors, sets, bytes and objects of
// other classes are refused, naming what was found.
#ifndef TORCHLENS_GRAPH_TORCH_LOAD_H_
#define TORCHLENS_GRAPH_TORCH_LOAD_H_

#include <ATen/core/ivalue.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace torchlens {

// The value in the bytes of a `torch.save` file. kInvalidArgument naming what is wrong
// (the record, the tensor by its place in the value, the opcode).
absl::StatusOr<c10::IValue> LoadPickled(absl::string_view bytes);

// The same, with the tensors of records stored uncompressed made over `bytes` in place:
// no copy, and with a mapping made with ReadLimits::page_on_use (graph/file_io.h) each
// value is read from disk when first used. Every such tensor holds a reference to
// `owner`, which keeps `bytes` alive and writable.
absl::StatusOr<c10::IValue> LoadPickledInPlace(absl::string_view bytes,
                                               std::shared_ptr<void> owner);

// The value in the `torch.save` file at `path` (read as graph/file_io.h reads files: no
// devices, bounded pipes). Messages start with "<what> '<path>'".
absl::StatusOr<c10::IValue> LoadTorchSaved(const std::string& path,
                                           absl::string_view what = "torch.save file");

// The arguments of a forward call saved with `torch.save`: a tensor is one argument, a
// list or tuple one argument per element (a tensor, a list of tensors, ...).
absl::StatusOr<std::vector<c10::IValue>> LoadInputs(const std::string& path);

}  // namespace torchlens

#endif  // TORCHLENS_GRAPH_TORCH_LOAD_H_
