#!/usr/bin/python3
"""Capture semantics on eager models: module attribution, the patched classes, grad modes,
what TorchScript cannot script, threads, errors in forward, and values shared with Python.

Oracles: the same forward run in eager PyTorch without capture (outputs, buffers,
gradients, random draws), and the model code itself (which module runs which op).
"""
import copy
import dataclasses
import os
import sys
import threading

# Bazel runs the test from its runfiles, where the built package is.
sys.path.insert(0, os.path.join(os.environ["TEST_SRCDIR"], "torchlens", "torchlens_dispatch", "python"))

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import torchlens_cpp as tl  # noqa: E402


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        return F.relu(self.fc(x))  # F.relu belongs to the block, fc's linear to fc


class Twice(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()
        self.head = torch.nn.Linear(4, 2)

    def forward(self, x):
        x = self.block(self.block(x))  # one module called twice: two passes
        return torch.cat([self.head(x), x.sum(1, keepdim=True)], 1)


def ops_of(trace):
    return [o for o in trace.ops if o.func_name]


def test_module_attribution_and_passes():
    torch.manual_seed(0)
    model = Twice()
    x = torch.randn(3, 4)
    trace = tl.trace(model, x)
    ops = [(o.type, o.module_address, o.pass_num) for o in ops_of(trace)]
    assert ops == [
        ("linear", "block.fc", 1), ("relu", "block", 1),
        ("linear", "block.fc", 2), ("relu", "block", 2),
        ("linear", "head", 1), ("sum", "", 1), ("cat", "", 1),
    ]
    linear = [o for o in ops_of(trace) if o.type == "linear"]
    assert linear[0].label.split(":")[0] == linear[1].label.split(":")[0]
    assert linear[0].label.endswith(":1") and linear[1].label.endswith(":2")
    assert torch.equal(trace.output, model(x))
    assert trace.validate().passed


class Recurrent(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("h", torch.zeros(3))
        self.inner = Inner()

    def forward(self, x):
        self.h = torch.tanh(self.h + x)
        self.inner(x)
        return self.h * 2


class Inner(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("state", torch.zeros(3))

    def forward(self, x):
        self.state = self.state + x
        self.register_buffer("state", self.state * 2)  # an existing name: a reassignment
        return self.state


def setattr_patched(cls):
    return "__setattr__" in cls.__dict__ or "register_buffer" in cls.__dict__


def test_reassignments_and_register_buffer_recorded_once():
    model = Recurrent()
    x = torch.ones(3)
    trace = tl.trace(model, x)
    h = trace.buffers["h"]
    assert [v.buffer_write_kind for v in h.versions] == [None, "reassign"]
    state = trace.buffers["inner.state"]
    assert [v.buffer_write_kind for v in state.versions] == [None, "reassign", "reassign"]
    assert torch.equal(state.final_value, torch.full((3,), 2.0))
    assert torch.equal(model.inner.state, torch.full((3,), 2.0))
    assert not setattr_patched(Recurrent) and not setattr_patched(Inner)
    assert trace.validate().passed


class DirectSlot(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("b", torch.zeros(2))

    def forward(self, x):
        self._buffers["b"] = x * 3  # bypasses __setattr__: seen when the capture ends
        return x + 1


def test_buffers_dict_write_is_one_version():
    trace = tl.trace(DirectSlot(), torch.ones(2))
    b = trace.buffers["b"]
    # Nothing read the buffer before, so its only version is the reassignment.
    assert [v.buffer_write_kind for v in b.versions] == ["reassign"]
    assert b.num_overwrites == 1
    assert torch.equal(b.final_value, torch.full((2,), 3.0))


class Raises(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("n", torch.zeros(()))
        self.fc = torch.nn.Linear(2, 2)

    def forward(self, x):
        self.n.add_(1)
        self.n = self.n * 1
        y = self.fc(x)
        raise ValueError("model says no")


def test_forward_error_propagates_restores_and_leaves_a_partial_trace():
    model = Raises()
    with pytest.raises(ValueError, match="^model says no$"):
        tl.trace(model, torch.ones(2))
    assert not setattr_patched(Raises) and not setattr_patched(torch.nn.Linear)
    assert "forward" not in model.__dict__ and "forward" not in model.fc.__dict__
    x = torch.ones(2)
    with pytest.raises(ValueError, match="^model says no$"):
        with tl.capture(model) as cap:
            model(x)
    assert cap.trace is not None and cap.trace.partial
    assert "model says no" in cap.trace.partial_reason
    assert [o.type for o in ops_of(cap.trace)] == ["add_", "mul", "linear"]
    assert cap.finish() is cap.trace
    # The thread captures again afterwards.
    ok = tl.trace(torch.nn.Linear(2, 2), torch.ones(2))
    assert [o.type for o in ops_of(ok)] == ["linear"]


class Shared(torch.nn.Module):
    """A class whose instances also live outside the model."""

    def __init__(self):
        super().__init__()
        self.register_buffer("v", torch.zeros(1))

    def forward(self, x):
        self.v = self.v + x.sum()
        return x + self.v


def test_shared_classes_restored_and_outside_instances_untouched():
    inside, outside = Shared(), Shared()
    with tl.capture(inside) as cap:
        out = inside(torch.ones(2))
        outside(torch.ones(2))  # same class, not the model: no version of the model's
    trace = cap.finish(out)
    assert [v.buffer_write_kind for v in trace.buffers["v"].versions] == [None, "reassign"]
    assert not setattr_patched(Shared)
    assert torch.equal(outside.v, torch.full((1,), 2.0))


class Bn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.bn = torch.nn.BatchNorm1d(4)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(self.bn(self.fc(x))).sum()


@pytest.mark.parametrize("mode", ["grad", "no_grad", "inference_mode"])
def test_grad_modes_and_backward(mode):
    torch.manual_seed(3)
    model = Bn().train()
    reference = copy.deepcopy(model)
    x = torch.randn(5, 4)
    context = {"grad": torch.enable_grad, "no_grad": torch.no_grad,
               "inference_mode": torch.inference_mode}[mode]
    torch.manual_seed(7)
    with context():
        expected = reference(x)
    after_reference = torch.rand(3)  # the generator's state after the plain forward
    torch.manual_seed(7)
    with context():
        trace = tl.trace(model, x)
    assert torch.equal(torch.rand(3), after_reference)  # the capture drew nothing extra
    assert torch.equal(trace.output.detach(), expected.detach())
    for name, buffer in reference.named_buffers():
        assert torch.equal(dict(model.named_buffers())[name], buffer), name
    assert trace.validate().passed
    if mode == "grad":
        trace.output.backward()
        expected.backward()
        for (name, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
            assert torch.equal(p.grad, q.grad), name


@dataclasses.dataclass
class Pair:
    a: torch.Tensor
    b: torch.Tensor


class Unscriptable(torch.nn.Module):
    """What TorchScript cannot script: Python control flow on values, *args/**kwargs,
    dict and dataclass inputs and outputs, non-tensor arguments, numpy between ops."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 3)

    def forward(self, *args, scale=1.0, **kwargs):
        x = args[0]["x"]
        pair = kwargs["pair"]
        h = self.fc(x) * scale
        if h.sum().item() > 0:  # control flow on a value
            h = h + pair.a
        else:
            h = h - pair.b
        shift = torch.from_numpy(np.tanh(h.detach().numpy()))  # a Python library between ops
        return {"out": h + shift, "pair": Pair(h, shift)}


def test_models_torchscript_cannot_script():
    torch.manual_seed(4)
    model = Unscriptable()
    x = torch.randn(2, 3)
    pair = Pair(torch.ones(2, 3), torch.full((2, 3), 2.0))
    expected = model({"x": x}, scale=0.5, pair=pair)
    trace = tl.trace(model, ({"x": x},), {"scale": 0.5, "pair": pair})
    assert torch.equal(trace.output["out"], expected["out"])
    assert trace.input_labels == ["input_1", "input_2", "input_3"]
    assert len(trace.output_labels) == 3  # out, pair.a, pair.b: depth-first
    assert torch.equal(trace[trace.output_labels[2]].out, expected["pair"].b)
    assert trace.validate().passed


def test_other_threads_are_not_captured():
    torch.manual_seed(5)
    mine, theirs = Twice(), Twice()
    x = torch.randn(2, 4)
    results = {}
    started, release = threading.Event(), threading.Event()

    def other():
        started.set()
        release.wait()
        for _ in range(3):
            results["plain"] = mine(x)  # the captured model itself, uncaptured here
        results["trace"] = tl.trace(theirs, x)

    thread = threading.Thread(target=other)
    thread.start()
    started.wait()
    with tl.capture(mine) as cap:
        release.set()
        out = mine(x)
        thread.join()
    trace = cap.finish(out)
    assert len(ops_of(trace)) == 7  # only this thread's forward
    assert torch.equal(results["plain"], out)
    assert len(ops_of(results["trace"])) == 7
    assert results["trace"].validate().passed


def test_values_shared_with_python_are_checked_before_replay():
    trace = tl.trace(Twice(), torch.randn(2, 4))
    value = trace.ops[2].out
    value.add_(1)  # writes the trace's memory
    with pytest.raises(tl.Error, match="written in place after the capture"):
        trace.validate()
    with pytest.raises(tl.Error, match="written in place"):
        trace.do({trace.ops[1].label: torch.zeros_like(trace.ops[1].out)})
    # An optimizer step writes the parameters, which traces read by reference.
    model = Twice()
    trace = tl.trace(model, torch.randn(2, 4))
    with torch.no_grad():
        model.head.weight.mul_(2)
    with pytest.raises(tl.Error, match="parameter 'head.weight'"):
        trace.validate()
    # Reading values is fine; so is writing a clone.
    trace = tl.trace(Twice(), torch.randn(2, 4))
    trace.ops[2].out.clone().add_(1)
    assert trace.validate().passed


def test_capture_misuse():
    model = Twice()
    with pytest.raises(TypeError):
        tl.capture(torch.ones(2))
    cap = tl.capture(model)
    with pytest.raises(tl.Error):
        cap.finish(torch.ones(2))
    with cap:
        with pytest.raises(tl.Error, match="already capturing"):
            with tl.capture(model):
                pass
        out = model(torch.ones(1, 4))
    trace = cap.finish(out)
    with pytest.raises(tl.Error):
        cap.finish(out)
    assert trace.output_labels == ["output_1"]


if __name__ == "__main__":
    # Bazel runs a link named after the target; pytest collects only *.py files.
    sys.exit(pytest.main([os.path.realpath(__file__), "-q", "-p", "no:cacheprovider"]))
