"""Issue 52's test models: gradients, with eager PyTorch's retain_grad() values as oracle.

tools/gen_testdata.py writes them like every test model (NAME.pt, NAME.expected.pt). Each
model here has an oracle beside it: the same computation written out in eager PyTorch, each
op's output kept under the label torchlens gives that op when it captures the scripted model
(TraceModule), so that retain_grad() gives the gradient each Op::grad must hold. The loss is
the sum of the outputs' sums, as the command-line tool's --backward takes it. The expected
file then also holds:
    grad__LABEL             the gradient of node LABEL (':' becomes '__pass')
    nograd__LABEL           a node no gradient reaches (the value is 0)
    param_grad__ADDRESS     each parameter's gradient (dots become '__')
An in-place op's input is kept from an out-of-place twin of the computation: retain_grad()
on a tensor written in place reports the gradient of its value after the write.
"""

import torch
import torch.nn as nn


class GradMlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 6)
        self.fc2 = nn.Linear(6, 6)
        self.fc3 = nn.Linear(6, 2)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        h = torch.tanh(self.fc2(h))
        return self.fc3(h)


def grad_mlp_oracle(m, x):
    a = m.fc1(x)
    b = torch.relu(a)
    c = m.fc2(b)
    d = torch.tanh(c)
    e = m.fc3(d)
    return e, {"linear_1_1:1": a, "relu_1_2:1": b, "linear_2_3:1": c, "tanh_1_4:1": d,
               "linear_3_5:1": e, "output_1": e}, []


class GradConvBn(nn.Module):
    """Conv, BatchNorm in training mode (its statistics written), ReLU, pooling, a head."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, padding=1)
        self.bn = nn.BatchNorm2d(3)
        self.fc = nn.Linear(3, 2)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        return self.fc(torch.flatten(torch.mean(y, dim=(2, 3), keepdim=True), 1))


def grad_convbn_oracle(m, x):
    a = m.conv(x)
    b = m.bn(a)
    c = torch.relu(b)
    d = torch.mean(c, dim=(2, 3), keepdim=True)
    e = torch.flatten(d, 1)
    f = m.fc(e)
    return f, {"conv2d_1_1:1": a, "batch_norm_1_3:1": b, "relu_1_4:1": c, "mean_1_5:1": d,
               "flatten_1_6:1": e, "linear_1_7:1": f}, []


class GradRecurrent(nn.Module):
    """A state buffer reassigned at each of three steps; it starts requiring grad (the
    state a previous step handed over), so its initial read has a gradient too."""

    def __init__(self):
        super().__init__()
        self.register_buffer("h", torch.zeros(1, 3).requires_grad_())
        self.cell = nn.Linear(3, 3)

    def forward(self, x):
        for _ in range(3):
            self.h = torch.tanh(self.cell(self.h) + x)
        return self.h


def grad_recurrent_oracle(m, x):
    h0 = m.h
    named = {"buffer_1:1": h0}
    h = h0
    for step in range(1, 4):
        lin = m.cell(h)
        s = lin + x
        h = torch.tanh(s)
        named.update({f"linear_1_1:{step}": lin, f"add_1_2:{step}": s, f"tanh_1_3:{step}": h,
                      f"buffer_1:{step + 1}": h})
    return h, named, []


class GradSharedOp(nn.Module):
    """One Linear called twice (its parameters' gradients add up), and a value read by two
    ops (its gradient is the sum of theirs)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        h = self.fc(x)
        a = torch.relu(self.fc(h))
        return a * h


def grad_shared_op_oracle(m, x):
    h = m.fc(x)
    g = m.fc(h)
    a = torch.relu(g)
    y = a * h
    return y, {"linear_1_1:1": h, "linear_1_1:2": g, "relu_1_2:1": a, "mul_1_3:1": y}, []


class GradDetached(nn.Module):
    """A branch computed from a detached value: no gradient reaches it."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)
        self.head = nn.Linear(3, 3)

    def forward(self, x):
        h = self.fc(x)
        side = torch.sigmoid(h.detach()) * 2.0
        return self.head(h) + side


def grad_detached_oracle(m, x):
    h = m.fc(x)
    y = m.head(h)
    side = torch.sigmoid(h.detach()) * 2.0
    out = y + side
    return out, {"linear_1_1:1": h, "linear_2_5:1": y, "add_1_6:1": out, "output_1": out}, [
        "detach_1_2:1", "sigmoid_1_3:1", "mul_1_4:1"]


class GradInplace(nn.Module):
    """relu_ on a Linear's output: the Linear's node has the gradient of the value before
    the write, relu_'s the one after."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 4)
        self.out = nn.Linear(4, 2)

    def forward(self, x):
        a = self.lin(x)
        a.relu_()
        return self.out(a) * 2.0


def grad_inplace_oracle(m, x):
    a = m.lin(x)
    b = torch.relu(a)  # the out-of-place twin of a.relu_()
    c = m.out(b)
    d = c * 2.0
    return d, {"linear_1_1:1": a, "relu__1_2:1": b, "linear_2_3:1": c, "mul_1_4:1": d}, []


def models(rand):
    """name: (factory, inputs, training), as gen_testdata.models() lists them."""
    return {
        "grad_mlp": (GradMlp, [rand(3, 4)], False),
        "grad_convbn_train": (GradConvBn, [rand(2, 2, 4, 4)], True),
        "grad_recurrent": (GradRecurrent, [rand(1, 3)], False),
        "grad_shared_op": (GradSharedOp, [rand(2, 3)], False),
        "grad_detached": (GradDetached, [rand(2, 3)], False),
        "grad_inplace": (GradInplace, [rand(2, 3)], False),
    }


ORACLES = {
    "grad_mlp": grad_mlp_oracle,
    "grad_convbn_train": grad_convbn_oracle,
    "grad_recurrent": grad_recurrent_oracle,
    "grad_shared_op": grad_shared_op_oracle,
    "grad_detached": grad_detached_oracle,
    "grad_inplace": grad_inplace_oracle,
}


def _key(label):
    return label.replace(":", "__pass")


def gradient_values(name, model, inputs):
    """The expected file's gradient entries for model `name` (empty for other models)."""
    oracle = ORACLES.get(name)
    if oracle is None:
        return {}
    inputs = [x.clone() for x in inputs]
    out, named, unreached = oracle(model, *inputs)
    for tensor in named.values():
        if tensor.requires_grad:
            tensor.retain_grad()
    outputs = out if isinstance(out, (tuple, list)) else [out]
    sum(o.sum() for o in outputs).backward()
    values = {}
    for label, tensor in named.items():
        assert tensor.grad is not None, (name, label)
        values["grad__" + _key(label)] = tensor.grad
    for label in unreached:
        values["nograd__" + _key(label)] = torch.tensor(0)
    for address, param in model.named_parameters():
        if param.grad is not None:
            values["param_grad__" + address.replace(".", "__")] = param.grad
    return values
