#!/usr/bin/python3
"""Exports torchvision 0.14's models to TorchScript for the zoo test (too large to commit).

usage: zoo_models.py OUT_DIR [--max_params N (default 1e9: all)] [--only a,b]

For each classification, segmentation, detection and video model of torchvision 0.14
(random weights), at a small input size, writes:
  OUT_DIR/NAME.pt            torch.jit.script of the model (torch.jit.trace if only that works)
  OUT_DIR/NAME.expected.pt   a scripted container of buffers: input_0, and for MODE in
                             (eval, train): MODE_output_N (eager outputs, flattened, seed 0
                             before the forward), MODE_buffer__ADDRESS (buffers after it)
and OUT_DIR/report.json: per model, "exported" ("script" | "trace") or the reason it could
not be. Models already exported are kept.
"""

import argparse
import copy
import json
import os
import subprocess
import sys
import traceback

import torch
import torch.nn as nn
import torchvision
from torchvision import models

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_testdata import Expected  # noqa: E402 - the same oracle container

torch.set_grad_enabled(False)


def input_for(name, family):
    if family == "video":
        if name.startswith("mvit"):
            return torch.randn(1, 3, 16, 224, 224)
        if name == "s3d":
            return torch.randn(2, 3, 16, 224, 224)
        return torch.randn(2, 3, 4, 64, 64)
    if family == "detection":
        return torch.randn(3, 96, 96)
    if name.startswith(("vit_", "swin", "maxvit")):
        return torch.randn(1, 3, 224, 224)
    # Batch 2: training-mode BatchNorm needs more than one value per channel.
    if name.startswith("inception"):
        return torch.randn(2, 3, 299, 299)  # its auxiliary head (train mode) needs it
    return torch.randn(2, 3, 64, 64)


def flatten(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        result = []
        for value in out.values():
            result.extend(flatten(value))
        return result
    if isinstance(out, (list, tuple)):
        result = []
        for item in out:
            result.extend(flatten(item))
        return result
    return []


def export(name, family, builder, out_dir):
    torch.manual_seed(0)
    # No weights, and no pretrained backbone (which would be downloaded).
    if family in ("detection", "segmentation"):
        model = builder(weights=None, weights_backbone=None)
    else:
        model = builder(weights=None)
    model.eval()
    x = input_for(name, family)
    args = ([x],) if family == "detection" else (x,)
    how = "script"
    try:
        scripted = torch.jit.script(copy.deepcopy(model))
    except Exception as script_error:  # noqa: BLE001 - any failure means: try tracing
        if family == "detection":
            raise RuntimeError(f"torch.jit.script failed: {str(script_error).splitlines()[0]}")
        scripted = torch.jit.trace(copy.deepcopy(model), args, check_trace=False)
        how = "trace"
    values = {"input_0": x}
    for mode in ("eval", "train"):
        eager = copy.deepcopy(model)
        eager.train(mode == "train")
        if family == "detection" and mode == "train":
            continue  # training detection models need targets
        torch.manual_seed(0)
        out = eager(*args)
        for i, t in enumerate(flatten(out)):
            values[f"{mode}_output_{i}"] = t
        for address, buf in eager.named_buffers():
            values[f"{mode}_buffer__" + address.replace(".", "__")] = buf
    scripted.save(os.path.join(out_dir, name + ".pt.tmp"))
    torch.jit.script(Expected(values)).save(os.path.join(out_dir, name + ".expected.pt"))
    os.replace(os.path.join(out_dir, name + ".pt.tmp"), os.path.join(out_dir, name + ".pt"))
    return how


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    # Every torchvision 0.14 model fits a 24 GB machine (tools/zoo/README.md has their
    # cost); --max_params 2e8 leaves out the four above 200M parameters.
    parser.add_argument("--max_params", type=float, default=1e9)
    parser.add_argument("--only", default="")
    options = parser.parse_args()
    os.makedirs(options.out_dir, exist_ok=True)
    report_path = os.path.join(options.out_dir, "report.json")
    report = json.load(open(report_path)) if os.path.exists(report_path) else {}
    families = {
        "classification": models,
        "segmentation": models.segmentation,
        "detection": models.detection,
        "video": models.video,
    }
    only = set(filter(None, options.only.split(",")))
    for family, module in families.items():
        for name in models.list_models(module=module):
            if only and name not in only:
                continue
            if os.path.exists(os.path.join(options.out_dir, name + ".pt")) and name in report:
                continue
            if len(only) != 1:
                # One process per model: a model TorchScript fails to compile can leave the
                # compilation cache broken for the next ones ("try blocks aren't supported").
                subprocess.run([sys.executable, __file__, options.out_dir, "--only", name,
                                "--max_params", str(options.max_params)], check=False)
                report = json.load(open(report_path)) if os.path.exists(report_path) else {}
                continue
            builder = models.get_model_builder(name)
            try:
                torch.manual_seed(0)
                probe = (builder(weights=None, weights_backbone=None)
                         if family in ("detection", "segmentation") else builder(weights=None))
                params = sum(p.numel() for p in probe.parameters())
                del probe
                if params > options.max_params:
                    report[name] = {"family": family, "exported": None,
                                    "reason": f"{params / 1e6:.0f}M parameters, above the "
                                              f"zoo's {options.max_params / 1e6:.0f}M budget"}
                else:
                    how = export(name, family, builder, options.out_dir)
                    report[name] = {"family": family, "exported": how}
            except Exception as error:  # noqa: BLE001 - report and go on
                report[name] = {"family": family, "exported": None,
                                "reason": str(error).strip().splitlines()[0][:300]}
                traceback.print_exc(limit=1)
            print(name, report[name], file=sys.stderr, flush=True)
            with open(report_path, "w") as f:
                json.dump(report, f, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
