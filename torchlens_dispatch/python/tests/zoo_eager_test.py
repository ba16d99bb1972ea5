#!/usr/bin/python3
"""torchvision models run eagerly (never scripted) validate, in eval and train mode.

The test suite's small set of the zoo (README "Model zoo"), at the zoo's small input sizes,
random weights. Capture must not change what the model computes: outputs and buffers are
bit-identical to an uncaptured run from the same state and seed.
"""
import copy
import os
import sys

# Bazel runs the test from its runfiles, where the built package is.
sys.path.insert(0, os.path.join(os.environ["TEST_SRCDIR"], "torchlens", "torchlens_dispatch", "python"))

import pytest  # noqa: E402
import torch  # noqa: E402
from torchvision import models  # noqa: E402
from torchvision.models import segmentation, video  # noqa: E402

import torchlens_cpp as tl  # noqa: E402

torch.set_num_threads(1)

ZOO = {
    "alexnet": (models.alexnet, (2, 3, 64, 64)),
    "resnet18": (models.resnet18, (2, 3, 64, 64)),
    "mobilenet_v2": (models.mobilenet_v2, (2, 3, 64, 64)),
    "mobilenet_v3_small": (models.mobilenet_v3_small, (2, 3, 64, 64)),
    "squeezenet1_1": (models.squeezenet1_1, (2, 3, 64, 64)),
    "shufflenet_v2_x1_0": (models.shufflenet_v2_x1_0, (2, 3, 64, 64)),
    "mnasnet0_5": (models.mnasnet0_5, (2, 3, 64, 64)),
    "efficientnet_b0": (models.efficientnet_b0, (2, 3, 64, 64)),
    "googlenet": (lambda: models.googlenet(aux_logits=False, init_weights=True), (2, 3, 64, 64)),
    "densenet121": (models.densenet121, (2, 3, 64, 64)),
    "lraspp_mobilenet_v3_large": (
        lambda: segmentation.lraspp_mobilenet_v3_large(weights_backbone=None), (2, 3, 64, 64)),
    "fcn_resnet50": (lambda: segmentation.fcn_resnet50(weights_backbone=None), (2, 3, 64, 64)),
    "r3d_18": (video.r3d_18, (2, 3, 4, 32, 32)),
}


def flat(value):
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in flat(v)]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in flat(v)]
    return []


@pytest.mark.parametrize("mode", ["eval", "train"])
@pytest.mark.parametrize("name", sorted(ZOO))
def test_eager_zoo_model_validates(name, mode):
    make, shape = ZOO[name]
    torch.manual_seed(0)
    model = make().train(mode == "train")
    reference = copy.deepcopy(model)
    x = torch.randn(*shape)
    with torch.no_grad():
        torch.manual_seed(1)
        expected = flat(reference(x))
        torch.manual_seed(1)
        trace = tl.trace(model, x)
    got = flat(trace.output)
    assert len(got) == len(expected) == len(trace.output_labels)
    for a, b in zip(got, expected):
        assert torch.equal(a, b)
    for (address, buffer), (_, reference_buffer) in zip(model.named_buffers(),
                                                        reference.named_buffers()):
        assert torch.equal(buffer, reference_buffer), address
    if mode == "train" and any(n.endswith("running_mean") for n, _ in model.named_buffers()):
        assert trace.buffer_write_ops, "training-mode BatchNorm writes its statistics"
    report = trace.validate()
    assert report.passed, "\n".join(report.failures[:10])
    assert report.ops_checked > 0


if __name__ == "__main__":
    # Bazel runs a link named after the target; pytest collects only *.py files.
    sys.exit(pytest.main([os.path.realpath(__file__), "-q", "-p", "no:cacheprovider"]))
