#!/usr/bin/python3
"""The eager adapter's own mechanisms: module scopes patched on classes and instances, and
readings of a model reused only while the model is unchanged.

Oracles: the model code (which module runs which op), the model's structure after each
change, and eager PyTorch's outputs.
"""
import os
import sys
import threading

# Bazel runs the test from its runfiles, where the built package is.
sys.path.insert(0, os.path.join(os.environ["TEST_SRCDIR"], "torchlens", "torchlens_dispatch", "python"))

import pytest  # noqa: E402
import torch  # noqa: E402

import torchlens_cpp as tl  # noqa: E402


def ops_of(trace):
    return [(o.type, o.module_address) for o in trace.ops if o.func_name]


def scoped(cls):
    return "forward" in cls.__dict__ and type(cls.__dict__["forward"]).__name__ == "ScopedForward"


class Base(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x)


class Derived(Base):
    def forward(self, x):
        return super().forward(x * 2) + 1


class Holder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.base = Base()
        self.derived = Derived()

    def forward(self, x):
        return self.derived(self.base(x))


def test_super_forward_stays_in_the_module_and_classes_are_restored():
    trace = tl.trace(Holder(), torch.randn(3))
    assert ops_of(trace) == [("relu", "base"), ("mul", "derived"), ("relu", "derived"),
                             ("add", "derived")]
    assert all(o.pass_num == 1 for o in trace.ops)
    assert not scoped(Base) and not scoped(Derived) and not scoped(Holder)
    assert "forward" not in Base.__dict__ or Base.__dict__["forward"] is Base.forward


def test_same_ops_in_every_grad_mode():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4),
                                torch.nn.Dropout(0.3), torch.nn.GELU()).train()
    x = torch.randn(5, 4)
    labels = []
    for context in (torch.enable_grad, torch.no_grad, torch.inference_mode):
        with context():
            trace = tl.trace(model, x)
        labels.append([(o.label, o.func_name) for o in trace.ops])
    assert labels[0] == labels[1] == labels[2]
    assert [f for _, f in labels[0] if f] == ["aten::linear", "aten::add_", "aten::batch_norm",
                                              "aten::dropout", "aten::gelu"]


class InstanceForward(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = torch.nn.Linear(2, 2)
        self.inner.forward = lambda x: torch.tanh(x)  # an instance's own forward

    def forward(self, x):
        return self.inner(x)


def test_an_instances_own_forward_is_scoped_and_put_back():
    model = InstanceForward()
    own = model.inner.__dict__["forward"]
    trace = tl.trace(model, torch.ones(2))
    assert ops_of(trace) == [("tanh", "inner")]
    assert model.inner.__dict__["forward"] is own


class Swappable(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(2, 2)
        self.register_buffer("b", torch.zeros(2))

    def forward(self, x):
        return self.a(x) + self.b


def test_readings_follow_changes_to_the_model():
    torch.manual_seed(1)
    model = Swappable()
    x = torch.randn(2)
    first = tl.trace(model, x)
    again = tl.trace(model, x)
    assert ops_of(first) == ops_of(again) == [("linear", "a"), ("add", "")]
    # A replaced submodule.
    model.a = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
    trace = tl.trace(model, x)
    assert ops_of(trace) == [("linear", "a.0"), ("relu", "a.1"), ("add", "")]
    assert sorted(trace.params) == ["a.0.bias", "a.0.weight"]
    # A buffer replaced between captures.
    model.b = torch.full((2,), 5.0)
    trace = tl.trace(model, x)
    assert torch.equal(trace.buffers["b"].initial_value, torch.full((2,), 5.0))
    assert torch.equal(trace.output, model(x))
    # A parameter given other memory (`.data =` changes no dict).
    model.a[0].weight.data = torch.zeros(2, 2)
    trace = tl.trace(model, x)
    assert torch.equal(trace[trace.output_labels[0]].out, torch.relu(model.a[0].bias) + 5.0)
    assert trace.validate().passed
    # A new parameter registered on a module.
    model.a[0].register_parameter("scale", torch.nn.Parameter(torch.ones(1)))
    assert "a.0.scale" in tl.trace(model, x).params
    # A plain tensor attribute: a constant named by its address.
    model.offset = torch.ones(2)
    model.forward = lambda x: model.a(x) + model.offset
    trace = tl.trace(model, x)
    assert "offset" in [o.address for o in trace.ops if o.type == "constant"]


def test_two_threads_capture_one_model():
    torch.manual_seed(2)
    model = Holder()
    x = torch.randn(3)
    barrier = threading.Barrier(2)
    traces = [None, None]

    def capture(i):
        with tl.capture(model) as cap:
            barrier.wait()
            out = model(x)
            barrier.wait()  # both forwards ran while both captures were open
        traces[i] = cap.finish(out)

    threads = [threading.Thread(target=capture, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for trace in traces:
        assert ops_of(trace) == ops_of(traces[0]) and len(ops_of(trace)) == 4
        assert trace.validate().passed
    assert not scoped(Base) and not scoped(Derived)


class WithScript(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scripted = torch.jit.script(torch.nn.Linear(3, 3))
        self.head = torch.nn.Linear(3, 1)

    def forward(self, x):
        return self.head(torch.relu(self.scripted(x)))


def test_torchscript_submodule_runs_compiled():
    torch.manual_seed(3)
    model = WithScript()
    x = torch.randn(2, 3)
    trace = tl.trace(model, x)
    assert torch.equal(trace.output, model(x))
    assert [t for t, _ in ops_of(trace)] == ["linear", "relu", "linear"]
    assert ops_of(trace)[2] == ("linear", "head")
    assert trace.validate().passed


def test_finish_keeps_the_outputs():
    model = Holder()
    x = torch.randn(3)
    with tl.capture(model) as cap:
        out = {"y": model(x)}
    trace = cap.finish(out)
    assert trace.output is out


if __name__ == "__main__":
    # Bazel runs a link named after the target; pytest collects only *.py files.
    sys.exit(pytest.main([os.path.realpath(__file__), "-q", "-p", "no:cacheprovider"]))
