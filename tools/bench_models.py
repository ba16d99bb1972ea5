#!/usr/bin/python3
"""Writes the benchmark's TorchScript models into a folder (too large to commit).

usage: bench_models.py OUT_DIR

Models (random weights, seeded):
  mlp50.pt        50 x (Linear(16, 16) + ReLU), input [1, 16]      (op-bound)
  mlp200.pt       200 layers, mlp2000.pt 2000 layers               (scaling)
  mlp200_tied.pt  the same with one Linear(16, 16) shared by every layer, so that the
  mlp2000_tied.pt model's memory does not grow with its depth      (scaling control)
  resnet18.pt     torchvision ResNet-18, input [1, 3, 224, 224]    (compute-bound)
  resnet152.pt    torchvision ResNet-152, input [32, 3, 224, 224]  (capture to disk of
                  over 4 GB of values)
  recurrent.pt    a cell with a state buffer, 100 steps, input [1, 32]
  transformer.pt  nn.TransformerEncoderLayer(64, 4), input [1, 16, 64] (batch first)
  shufflenet_v2_x1_0.pt, mobilenet_v2.pt  torchvision, input [1, 3, 224, 224] (many
                  small ops: channel shuffles, views, depthwise convolutions)
"""

import os
import sys

import torch
import torch.nn as nn
import torchvision


def mlp(layers):
    modules = []
    for _ in range(layers):
        modules += [nn.Linear(16, 16), nn.ReLU()]
    return nn.Sequential(*modules)


def tied_mlp(layers):
    linear = nn.Linear(16, 16)
    return nn.Sequential(*([linear, nn.ReLU()] * layers))


class Recurrent(nn.Module):
    def __init__(self):
        super().__init__()
        self.cell = nn.Linear(32, 32)
        self.register_buffer("state", torch.zeros(1, 32))

    def forward(self, x):
        for _ in range(100):
            self.state = torch.tanh(self.cell(self.state) + x)
        return self.state


def main(out):
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    models = {
        "mlp50": mlp(50),
        "mlp200": mlp(200),
        "mlp2000": mlp(2000),
        "mlp200_tied": tied_mlp(200),
        "mlp2000_tied": tied_mlp(2000),
        "resnet18": torchvision.models.resnet18(),
        "resnet152": torchvision.models.resnet152(),
        "recurrent": Recurrent(),
        "transformer": nn.TransformerEncoderLayer(64, 4, dim_feedforward=128, batch_first=True),
        "shufflenet_v2_x1_0": torchvision.models.shufflenet_v2_x1_0(),
        "mobilenet_v2": torchvision.models.mobilenet_v2(),
    }
    for name, model in models.items():
        path = os.path.join(out, name + ".pt")
        if not os.path.exists(path):
            torch.jit.script(model.eval()).save(path + ".tmp")
            os.replace(path + ".tmp", path)
            print("wrote", path, file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1])
