#!/usr/bin/python3
"""Gradients of eager models through tl.trace(..., save_grads=True).

Each expected gradient is eager PyTorch's retain_grad() value for the same computation,
written out in the test (an in-place op's input from an out-of-place twin, since
retain_grad() on a tensor written in place reports its value after the write).
"""
import copy
import os
import sys
import tempfile

# Bazel runs the test from its runfiles, where the built package is.
sys.path.insert(0, os.path.join(os.environ["TEST_SRCDIR"], "torchlens", "torchlens_dispatch", "python"))

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import torchlens_cpp as tl  # noqa: E402


def compute_ops(trace):
    return [op for op in trace.ops if op.func_name]


def retained(*tensors):
    for t in tensors:
        t.retain_grad()
    return tensors


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 6)
        self.fc2 = nn.Linear(6, 2)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


class ConvBn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, padding=1)
        self.bn = nn.BatchNorm2d(3)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


class Recurrent(nn.Module):
    """A state buffer reassigned at each step."""

    def __init__(self):
        super().__init__()
        self.register_buffer("h", torch.zeros(1, 3))
        self.cell = nn.Linear(3, 3)

    def forward(self, x):
        for _ in range(3):
            self.h = torch.tanh(self.cell(self.h) + x)
        return self.h


class SharedOp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        h = self.fc(x)
        return torch.relu(self.fc(h)) * h


class Detached(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        h = self.fc(x)
        return h + torch.sigmoid(h.detach())


class Inplace(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 4)

    def forward(self, x):
        a = self.lin(x)
        a.relu_()
        return a * 2.0


def captured(model, x):
    trace = tl.trace(model, x, save_grads=True)
    trace.output.sum().backward()
    return trace


def assert_grads(trace, expected):
    """`expected`: one gradient per compute op, in execution order (None: no gradient)."""
    ops = compute_ops(trace)
    assert len(ops) == len(expected), [op.label for op in ops]
    for op, grad in zip(ops, expected):
        if grad is None:
            assert op.grad is None, op.label
        else:
            assert op.grad is not None, op.label
            assert torch.equal(op.grad, grad), op.label


def test_mlp():
    torch.manual_seed(0)
    model, x = Mlp(), torch.randn(3, 4)
    a = model.fc1(x)
    b = torch.tanh(a)
    c = model.fc2(b)
    retained(a, b, c)
    c.sum().backward()
    expected = [a.grad, b.grad, c.grad]
    params = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    trace = captured(model, x)
    assert_grads(trace, expected)
    assert trace["output_1"].grad is not None
    assert set(trace.param_grads) == set(params)
    for name, grad in params.items():
        assert torch.equal(trace.param_grads[name], grad), name


def test_an_input_that_requires_grad():
    torch.manual_seed(11)
    x = torch.randn(3, 4, requires_grad=True)
    trace = captured(Mlp(), x)
    assert torch.equal(trace["input_1"].grad, x.grad)  # its accumulation, as autograd made it


def test_convbn_in_training_mode():
    torch.manual_seed(1)
    model, x = ConvBn().train(), torch.randn(2, 2, 5, 5)
    twin = copy.deepcopy(model)
    a = twin.conv(x)
    b = twin.bn(a)
    c = torch.relu(b)
    retained(a, b, c)
    c.sum().backward()
    trace = captured(model, x)
    # BatchNorm counts the batch with num_batches_tracked.add_(1): no gradient there.
    assert_grads(trace, [a.grad, None, b.grad, c.grad])
    assert torch.equal(trace.param_grads["bn.weight"], twin.bn.weight.grad)


def test_recurrent_state_versions_and_a_state_that_requires_grad():
    torch.manual_seed(2)
    model, x = Recurrent(), torch.randn(1, 3)
    twin = copy.deepcopy(model)
    # The state a previous step handed over, still attached to its graph.
    previous = torch.randn(1, 3, requires_grad=True)
    model.h = previous * 1.0
    twin.h = h0 = previous * 1.0
    h0.retain_grad()
    states = []
    h = h0
    for _ in range(3):
        h = torch.tanh(twin.cell(h) + x)
        h.retain_grad()
        states.append(h)
    h.sum().backward()
    trace = captured(model, x)
    versions = trace.buffers["h"].versions
    assert len(versions) == 4
    assert torch.equal(versions[0].grad, h0.grad)
    for version, state in zip(versions[1:], states):
        assert version.buffer_write_kind == "reassign"
        assert torch.equal(version.grad, state.grad), version.label


def test_op_used_twice_and_a_value_read_twice():
    torch.manual_seed(3)
    model, x = SharedOp(), torch.randn(2, 3)
    twin = copy.deepcopy(model)
    h = twin.fc(x)
    g = twin.fc(h)
    a = torch.relu(g)
    y = a * h
    retained(h, g, a, y)
    y.sum().backward()
    trace = captured(model, x)
    assert [op.label for op in compute_ops(trace)] == [
        "linear_1_1:1", "linear_1_1:2", "relu_1_2:1", "mul_1_3:1"]
    assert_grads(trace, [h.grad, g.grad, a.grad, y.grad])
    assert torch.equal(trace.param_grads["fc.weight"], twin.fc.weight.grad)


def test_detached_branch_gets_no_gradient():
    torch.manual_seed(4)
    model, x = Detached(), torch.randn(2, 3)
    twin = copy.deepcopy(model)
    h = twin.fc(x)
    y = h + torch.sigmoid(h.detach())
    retained(h, y)
    y.sum().backward()
    trace = captured(model, x)
    assert [op.type for op in compute_ops(trace)] == ["linear", "detach", "sigmoid", "add"]
    assert_grads(trace, [h.grad, None, None, y.grad])


def test_inplace_activation():
    torch.manual_seed(5)
    model, x = Inplace(), torch.randn(2, 3)
    twin = copy.deepcopy(model)
    a = twin.lin(x)
    b = torch.relu(a)  # the out-of-place twin of a.relu_()
    c = b * 2.0
    retained(a, b, c)
    c.sum().backward()
    trace = captured(model, x)
    assert [op.type for op in compute_ops(trace)] == ["linear", "relu_", "mul"]
    assert_grads(trace, [a.grad, b.grad, c.grad])


@pytest.mark.parametrize("factory", [Mlp, ConvBn, Recurrent, SharedOp, Detached, Inplace])
def test_parameter_grads_bit_identical_to_an_uncaptured_run(factory):
    torch.manual_seed(6)
    model = factory().train()
    x = torch.randn(2, 2, 5, 5) if factory is ConvBn else torch.randn(2, 3 if factory is not Mlp else 4)
    if factory is Recurrent:
        x = x[:1]
    plain, captured_model = copy.deepcopy(model), copy.deepcopy(model)
    plain(x).sum().backward()
    tl.trace(captured_model, x, save_grads=True).output.sum().backward()
    for (name, p), (_, q) in zip(plain.named_parameters(), captured_model.named_parameters()):
        assert torch.equal(p.grad, q.grad), name


def test_backward_ops_and_validation():
    torch.manual_seed(7)
    model, x = Mlp(), torch.randn(3, 4)
    trace = captured(model, x)
    ops = trace.backward_ops
    assert [op.type for op in ops] == [
        "AddmmBackward0", "AccumulateGrad", "TBackward0", "AccumulateGrad", "TanhBackward0",
        "AddmmBackward0", "AccumulateGrad", "TBackward0", "AccumulateGrad"]
    assert all(op.is_backward for op in ops)
    assert all(op.forward_label for op in ops)  # each linked to a forward op
    assert [op.address or op.forward_label for op in ops] == [
        "linear_2_3:1", "fc2.bias", "linear_2_3:1", "fc2.weight", "tanh_1_2:1",
        "linear_1_1:1", "fc1.bias", "linear_1_1:1", "fc1.weight"]
    assert ops[4].children == [ops[5].label]
    report = trace.validate_gradients()
    assert report.passed, report.failures
    assert report.ops_checked == 6  # linear_1, tanh and four parameters
    assert report.not_checked == ["linear_2_3:1"]  # the output: the loss read it
    assert trace.validate().passed  # the forward still validates


def test_tampered_gradient_fails_validation():
    torch.manual_seed(8)
    trace = captured(SharedOp(), torch.randn(2, 3))
    trace["relu_1_2:1"].grad.mul_(1.5)  # the trace's own gradient
    report = trace.validate_gradients()
    assert not report.passed
    assert any(line.startswith("relu_1_2:1: ") for line in report.failures), report.failures


def test_no_backward_and_a_second_backward():
    torch.manual_seed(9)
    model, x = Mlp(), torch.randn(3, 4)
    trace = tl.trace(model, x, save_grads=True)
    assert trace.records_gradients
    assert all(op.grad is None for op in trace.ops)
    assert trace.backward_ops == [] and trace.param_grads == {}
    loss = trace.output.sum()
    loss.backward(retain_graph=True)
    first = trace["tanh_1_2:1"].grad
    stale = trace.backward_ops[0]
    (loss * 2.0).backward()  # replaces the first call's gradients
    assert torch.equal(trace["tanh_1_2:1"].grad, first * 2.0)
    assert stale.type == "AddmmBackward0"  # read again: the second call's
    with pytest.raises(tl.Error, match="validate_gradients|save_grads|no gradients"):
        tl.trace(model, x).validate_gradients()


def test_capture_guard_and_saved_file():
    torch.manual_seed(10)
    model, x = Mlp(), torch.randn(3, 4)
    with tl.capture(model, save_grads=True) as cap:
        out = model(x)
    trace = cap.finish(out)
    out.sum().backward()
    path = os.path.join(tempfile.mkdtemp(), "t.pt")
    trace.save(path)
    data = torch.load(path)
    ops = {op["label"]: op for op in data["ops"]}
    assert torch.equal(ops["tanh_1_2:1"]["grad"], trace["tanh_1_2:1"].grad)
    assert [op["type"] for op in data["backward_ops"]][0] == "AddmmBackward0"
    assert torch.equal(data["param_grads"]["fc1.weight"], trace.param_grads["fc1.weight"])
    loaded = tl.load(path)
    assert torch.equal(loaded["tanh_1_2:1"].grad, trace["tanh_1_2:1"].grad)
    assert len(loaded.backward_ops) == len(trace.backward_ops)
    assert loaded.validate_gradients().passed


if __name__ == "__main__":
    # Bazel runs a link named after the target; pytest collects only *.py files.
    sys.exit(pytest.main([os.path.realpath(__file__), "-q", "-p", "no:cacheprovider"]))
