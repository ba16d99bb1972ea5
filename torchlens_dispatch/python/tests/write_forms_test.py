#!/usr/bin/python3
"""Every buffer write form the C++ side handles, captured eagerly and through the CLI.

Each model is scripted and saved before anything runs, its eager twin is captured with
tl.trace, and the saved script is captured by the command-line tool (`--save`). Both traces
must hold the same buffers with the same versions: the same write kinds, the same
changed flags and bit-identical values. The files the tool writes and the ones Python
writes are one format: the tool reads a Python-saved trace back (`--trace ... --validate`).
"""
import copy
import os
import subprocess
import sys

RUNFILES = os.path.join(os.environ["TEST_SRCDIR"], "torchlens")
# Bazel runs the test from its runfiles, where the built package is.
sys.path.insert(0, os.path.join(RUNFILES, "torchlens_dispatch", "python"))

import pytest  # noqa: E402
import torch  # noqa: E402

import torchlens_cpp as tl  # noqa: E402

CLI = os.path.join(RUNFILES, "tools", "torchlens")


class Reassign(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("h", torch.zeros(3))

    def forward(self, x):
        self.h = torch.tanh(self.h + x)
        self.h = torch.tanh(self.h * x)
        return self.h + 1


class InPlace(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("a", torch.ones(3))
        self.register_buffer("c", torch.zeros(3))

    def forward(self, x):
        self.a.add_(x)
        self.a.mul_(2.0)
        self.c.copy_(x * 3)
        return self.a + self.c


class SliceAssign(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("b", torch.arange(6.0))

    def forward(self, x):
        self.b[1:4] = x
        self.b[0] = 7.0
        return self.b * 2


class DataCopy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("m", torch.zeros(3))

    def forward(self, x):
        self.m.data.copy_(x + 1)
        return x * self.m


class Views(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("grid", torch.arange(6.0).reshape(2, 3))

    def forward(self, x):
        self.grid.t()[1].add_(x[:2])
        self.grid.view(-1)[4].mul_(3.0)
        self.grid[1].narrow(0, 0, 2).zero_()
        return self.grid.sum(0) + x


class Norms(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = torch.nn.BatchNorm1d(3)
        self.inorm = torch.nn.InstanceNorm1d(3, track_running_stats=True, affine=True)

    def forward(self, x):
        y = self.bn(x.reshape(2, 3))
        return self.inorm(y.reshape(1, 3, 2))


# Each model, its mode, and the write kinds its code makes (the oracle for both captures):
# BatchNorm and InstanceNorm update their statistics in kernels (fused) and count batches
# with add_ (inplace) in training mode; in eval mode BatchNorm writes nothing and
# InstanceNorm writes its statistics back (fused, mostly unchanged).
class InstanceNormEval(torch.nn.Module):
    """In eval mode InstanceNorm still writes its statistics back (the mean of their
    repeated copies), which changes them in the last bit for 7 or more samples."""

    def __init__(self):
        super().__init__()
        self.inorm = torch.nn.InstanceNorm1d(3, track_running_stats=True)
        with torch.no_grad():
            self.inorm.running_mean.copy_(torch.tensor([0.3, -1.7, 2.9]))
            self.inorm.running_var.copy_(torch.tensor([0.7, 1.3, 2.1]))

    def forward(self, x):
        return self.inorm(x.reshape(10, 3, 2))


MODELS = [
    (Reassign, "eval", {"reassign"}), (InPlace, "eval", {"inplace"}),
    (SliceAssign, "eval", {"inplace"}), (DataCopy, "eval", {"inplace"}),
    (Views, "eval", {"inplace"}), (Norms, "train", {"fused", "inplace"}),
    (Norms, "eval", {"fused"}), (InstanceNormEval, "eval", {"fused"}),
]


def versions(trace):
    return {
        address: [(v.buffer_write_kind, v.buffer_value_changed, v.out) for v in buffer.versions]
        for address, buffer in trace.buffers.items()
    }


@pytest.mark.parametrize("model_class,mode,kinds", MODELS,
                         ids=[f"{m.__name__}-{k}" for m, k, _ in MODELS])
def test_eager_and_scripted_capture_the_same_versions(model_class, mode, kinds, tmp_path):
    torch.manual_seed(0)
    model = model_class()
    model.train(mode == "train")
    scripted = torch.jit.script(copy.deepcopy(model))
    model_file, input_file, trace_file = (str(tmp_path / n) for n in ("m.pt", "x.pt", "t.pt"))
    scripted.save(model_file)
    x = {Norms: torch.randn(6), InstanceNormEval: torch.randn(60)}.get(model_class,
                                                                      torch.randn(3))
    torch.save(x, input_file)

    eager = tl.trace(model, x)
    subprocess.run([CLI, "--model", model_file, "--input", input_file, "--mode", mode,
                    "--save", trace_file, "--summary", str(tmp_path / "summary.txt")],
                   check=True, capture_output=True)
    cli = tl.load(trace_file)

    eager_versions, cli_versions = versions(eager), versions(cli)
    assert sorted(eager_versions) == sorted(cli_versions)
    for address, expected in cli_versions.items():
        got = eager_versions[address]
        assert [(k, c) for k, c, _ in got] == [(k, c) for k, c, _ in expected], address
        for (_, _, a), (_, _, b) in zip(got, expected):
            assert torch.equal(a, b), address
        assert torch.equal(eager.buffers[address].final_value, cli.buffers[address].final_value)
    assert {k for vs in eager_versions.values() for k, _, _ in vs} - {None} == kinds
    assert torch.equal(eager[eager.output_labels[0]].out, cli[cli.output_labels[0]].out)
    assert eager.validate().passed

    # A trace file written from Python is one the tool reads and validates.
    python_file = str(tmp_path / "python.pt")
    eager.save(python_file)
    checked = subprocess.run([CLI, "--trace", python_file, "--validate"],
                             capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    assert "Validation: PASSED" in checked.stdout


if __name__ == "__main__":
    # Bazel runs a link named after the target; pytest collects only *.py files.
    sys.exit(pytest.main([os.path.realpath(__file__), "-q", "-p", "no:cacheprovider"]))
