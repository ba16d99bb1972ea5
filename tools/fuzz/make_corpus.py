#!/usr/bin/python3
"""Writes the seed corpora of the archive fuzz targets, valid and hostile.

Run with Debian's python3-torch (1.13):   /usr/bin/python3 tools/fuzz/make_corpus.py

tools/fuzz/corpus/input_file/    torch.save files: what Python writes (every pickle
                                 protocol, lists, a Parameter) and tensors whose metadata
                                 points past their storage (issue 17)
tools/fuzz/corpus/model_archive/ torch.jit.save archives: a small model, and copies whose
                                 data.pkl makes LibTorch's unpickler pop values its stack
                                 does not hold, or whose parameter outgrows its record;
                                 models calling operators this process does not have;
                                 functions calling each other 3,000 deep, and 16,400 of them

The CLI test (tools/torchlens_cli_test.sh) runs the tool on the hostile files. Each file is
small; the hostile metadata claims sizes, the bytes are not there.

Files the fuzzers found are kept in the corpora as they were found, not written here:
trace_file/stack_underflow.pt; model_archive/debug_info_unprintable.pt and
model_archive/crc_debug_record.pt, whose debug records fail their CRC, which LibTorch's
reader does not check, and which LibTorch then failed to print inside a noexcept function
while it reported a compile error (crc_debug_record.pt's record also carries the directory
attribute, as below); model_archive/case_folded_folder.pt, whose
debug record lies in "debug_iNfo_unknown_global/" while the archive's folder is
"debug_info_unknown_global/": LibTorch's reader matches names without regard to case and
read it, through an unknown global, inside the same noexcept function;
model_archive/debug_record_marked_directory.pt, whose debug record's external attributes
carry the DOS directory bit: LibTorch's reader then reads no bytes into the record it
hands out, and printed those inside the same noexcept function (torchlens no longer calls
it: NOTE [ErrorReport::what() ends the process]); model_archive/case_folded_code_folder.pt,
whose code record lies in "coDe/": LibTorch's reader reads it as "code/__torch__.py" and
its compiler read uninitialized memory on the class constant without a type in it, which
the check of code records skipped.
"""

import collections
import io
import os
import pickle
import sys
import zipfile

import torch
import torch.nn as nn
import torchvision

HERE = os.path.dirname(os.path.abspath(__file__))
INPUTS = os.path.join(HERE, "corpus", "input_file")
MODELS = os.path.join(HERE, "corpus", "model_archive")


class _Storage:
    """Stands for the storage record data/0 in a hand-made pickle."""

    def __init__(self, numel):
        self.numel = numel


class _Tensor:
    """Pickles as torch._utils._rebuild_tensor_v2 with the metadata it is given."""

    def __init__(self, storage, offset, size, stride):
        self.args = (storage, offset, tuple(size), tuple(stride), False, collections.OrderedDict())

    def __reduce__(self):
        return (torch._utils._rebuild_tensor_v2, self.args)


def _pickle(value):
    out = io.BytesIO()
    pickler = pickle.Pickler(out, protocol=2)
    pickler.persistent_id = lambda obj: (
        ("storage", torch.FloatStorage, "0", "cpu", obj.numel) if isinstance(obj, _Storage) else None
    )
    pickler.dump(value)
    return out.getvalue()


def _archive(path, records):
    """A zip as torch.save writes it: stored entries in one directory."""
    name = os.path.splitext(os.path.basename(path))[0]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for record, data in records:
            z.writestr(zipfile.ZipInfo(f"{name}/{record}"), data)  # dated 1980: reproducible


def hostile_tensor(path, numel, stored_floats, offset, size, stride):
    """A tensor whose storage claims `numel` floats, of which `stored_floats` are stored."""
    data = _pickle(_Tensor(_Storage(numel), offset, size, stride))
    _archive(path, [("data.pkl", data), ("data/0", b"\0" * 4 * stored_floats), ("version", b"3\n")])


def inputs():
    os.makedirs(INPUTS, exist_ok=True)
    t = torch.arange(6.0).reshape(2, 3)
    for protocol in (1, 2, 4, 5):
        torch.save(t, os.path.join(INPUTS, f"protocol{protocol}.pt"), pickle_protocol=protocol)
    torch.save([t], os.path.join(INPUTS, "list_of_one.pt"))
    torch.save([[t, t[0]], [t.t()]], os.path.join(INPUTS, "list_of_lists.pt"))
    torch.save(nn.Parameter(t), os.path.join(INPUTS, "parameter.pt"))
    torch.save([{"x": t[1:], "n": 3}], os.path.join(INPUTS, "dict_in_list.pt"))
    # Size, offset and stride past the 6 stored floats; the 4 GB claim overflows 32 bits.
    hostile_tensor(os.path.join(INPUTS, "size_16mb.pt"), 6, 6, 0, [2048, 2048], [2048, 1])
    hostile_tensor(os.path.join(INPUTS, "size_4gb.pt"), 6, 6, 0, [65536, 16384], [16384, 1])
    hostile_tensor(os.path.join(INPUTS, "offset.pt"), 6, 6, 1 << 20, [2, 3], [3, 1])
    hostile_tensor(os.path.join(INPUTS, "stride.pt"), 6, 6, 0, [2, 3], [1 << 20, 1])
    hostile_tensor(os.path.join(INPUTS, "negative_stride.pt"), 6, 6, 5, [6], [-1])
    hostile_tensor(os.path.join(INPUTS, "small_overrun.pt"), 6, 6, 0, [2, 4], [4, 1])
    # The storage claims 1,048,576 floats; its record holds 6.
    hostile_tensor(os.path.join(INPUTS, "truncated_record.pt"), 1 << 20, 6, 0, [6], [1])
    storage_declared_twice(os.path.join(INPUTS, "storage_twice.pt"))


def storage_declared_twice(path):
    """Two tensors naming storage data/0, as 6 and as 12 floats: torch.save names one
    storage once per tensor, always alike."""
    data = _pickle([_Tensor(_Storage(6), 0, [6], [1]), _Tensor(_Storage(12), 0, [6], [1])])
    _archive(path, [("data.pkl", data), ("data/0", b"\0" * 48), ("version", b"3\n")])


# A TorchScript archive's data.pkl replaced by a program that pops values its stack does
# not hold (LibTorch 1.13 aborted with "free(): invalid size" or crashed).
UNDERFLOWS = {
    "tuple2": b"\x80\x02K\x01\x86.",
    "tuple3": b"\x80\x02K\x01K\x02\x87.",
    "reduce": b"\x80\x02K\x01R.",
    "build": b"\x80\x02K\x01b.",
    "newobj": b"\x80\x02K\x01\x81.",
}


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2, 2)

    def forward(self, x):
        return self.fc(x)


def _rewrite(source, path, replace):
    """Copies the archive `source` to `path`, with records changed by `replace`."""
    old = os.path.splitext(os.path.basename(source))[0]
    new = os.path.splitext(os.path.basename(path))[0]
    with zipfile.ZipFile(source) as zin, zipfile.ZipFile(path, "w") as zout:
        for item in zin.infolist():
            record = item.filename[len(old) + 1:]
            data = replace(record, zin.read(item.filename))
            info = zipfile.ZipInfo(f"{new}/{record}")
            info.compress_type = item.compress_type
            zout.writestr(info, data)


class Nms(nn.Module):
    def forward(self, boxes, scores):
        return torchvision.ops.nms(boxes, scores, 0.5)


class Relu(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def models():
    os.makedirs(MODELS, exist_ok=True)
    # Operators this process lacks: torchvision's (library not loaded), and an aten:: one
    # of a newer PyTorch (the code calls torch.relu_of_a_newer_pytorch).
    torch.jit.script(Nms()).save(os.path.join(MODELS, "unknown_op_torchvision.pt"))
    relu = os.path.join(MODELS, "relu.pt")
    torch.jit.script(Relu()).save(relu)
    _rewrite(relu, os.path.join(MODELS, "unknown_op_aten.pt"),
             lambda record, data: data.replace(b"torch.relu(", b"torch.relu_of_a_newer_pytorch(")
             if record == "code/__torch__.py" else data)
    os.remove(relu)
    # Debug information naming a global LibTorch does not know: LibTorch throws while it
    # formats the torchvision::nms compile error, inside the noexcept ErrorReport::what(),
    # and the process ends (fuzzing).
    _rewrite(os.path.join(MODELS, "unknown_op_torchvision.pt"),
             os.path.join(MODELS, "debug_info_unknown_global.pt"),
             lambda record, data: data.replace(b"build_intlist", b"bpsld_intlist")
             if record == "code/__torch__.py.debug_pkl" else data)
    torch.manual_seed(0)
    small = os.path.join(MODELS, "small.pt")
    torch.jit.script(Small()).save(small)
    for name, program in UNDERFLOWS.items():
        _rewrite(small, os.path.join(MODELS, f"underflow_{name}.pt"),
                 lambda record, data, program=program: program if record == "data.pkl" else data)
    # fc.weight claims 2x4 floats (stride 4): 8 elements of a 4-float record.
    _rewrite(small, os.path.join(MODELS, "parameter_oversize.pt"),
             lambda record, data: data.replace(b"(K\x02K\x02t", b"(K\x02K\x04t", 1)
             .replace(b"(K\x02K\x01t", b"(K\x04K\x01t", 1) if record == "data.pkl" else data)
    # A class constant without its type (fuzzing: "__buffers__" became "__btffers__"):
    # LibTorch 1.13 reads uninitialized memory for its missing annotation.
    _rewrite(small, os.path.join(MODELS, "class_constant_without_type.pt"),
             lambda record, data: data.replace(b"  __buffers__ = []", b"  __btffers__ = []", 1)
             if record == "code/__torch__.py" else data)
    # The record of fc.weight cut to one float.
    _rewrite(small, os.path.join(MODELS, "record_cut_short.pt"),
             lambda record, data: data[:4] if record == "data/0" else data)


def _call_chain(source, path, links):
    """`source` (a Chain) with `links` functions, each calling the next: LibTorch compiles
    and inlines them one nested call deep each (NOTE [Calls LibTorch compiles by
    recursion]). The code record is deflated (it is repetitive) and its debug record,
    which describes the old code, dropped."""
    old = os.path.splitext(os.path.basename(source))[0]
    new = os.path.splitext(os.path.basename(path))[0]
    with zipfile.ZipFile(source) as zin, zipfile.ZipFile(path, "w") as zout:
        for item in zin.infolist():
            record = item.filename[len(old) + 1:]
            if record == "code/__torch__.py.debug_pkl":
                continue
            data = zin.read(item.filename)
            info = zipfile.ZipInfo(f"{new}/{record}")
            info.compress_type = item.compress_type
            if record == "code/__torch__.py":
                text = data.decode()
                head = text[:text.index("def chain_f0")]
                chain = "".join(f"def chain_f{i}(x: Tensor) -> Tensor:\n"
                                f"  return __torch__.chain_f{i + 1}(x, )\n" for i in range(links))
                chain += f"def chain_f{links}(x: Tensor) -> Tensor:\n  return x\n"
                data = (head + chain).encode()
                info.compress_type = zipfile.ZIP_DEFLATED
            zout.writestr(info, data)


def call_chains():
    """Functions 3,000 calls deep overflowed the main thread's stack in torch::jit::load,
    and 16,400 functions are more than LoadTorchScript compiles. Scripted last, so that
    the other archives' mangled names stay as they were."""

    @torch.jit.script
    def chain_f1(x: torch.Tensor) -> torch.Tensor:
        return x

    @torch.jit.script
    def chain_f0(x: torch.Tensor) -> torch.Tensor:
        return chain_f1(x)

    class Chain(nn.Module):
        def forward(self, x):
            return chain_f0(x)

    chain = os.path.join(MODELS, "chain.pt")
    torch.jit.script(Chain()).save(chain)
    _call_chain(chain, os.path.join(MODELS, "call_chain_3000.pt"), 3000)
    _call_chain(chain, os.path.join(MODELS, "call_chain_16400.pt"), 16400)
    os.remove(chain)


def main():
    # TorchScript writes class constants in set order: fix Python's hash seed so that
    # re-running the script reproduces the committed files byte for byte.
    if os.environ.get("PYTHONHASHSEED") != "0":
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable] + sys.argv)
    inputs()
    models()
    call_chains()
    print("wrote", INPUTS, "and", MODELS)


if __name__ == "__main__":
    main()
