"""A ResNet-50-sized image classifier written from scratch, so the GPU proof needs no torchvision.

The proof wants a model whose step time is a realistic data consumer: the
bottleneck ResNet with blocks [3, 4, 6, 3] and widths 64..2048 (about 25.6M
parameters at 1000 classes) is the workload every loader benchmark is quoted
against. ``tiny_resnet`` keeps the same code path at a size a CPU test can run.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Bottleneck", "ResNet", "resnet50", "tiny_resnet", "count_parameters", "TrainStep"]


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (carries the stride), 1x1 expand by 4, plus a shortcut."""

    expansion = 4

    def __init__(self, in_ch: int, width: int, stride: int = 1) -> None:
        super().__init__()
        out_ch = width * self.expansion
        self.conv1 = nn.Conv2d(in_ch, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_ch, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_ch)
        # Zero-init the last BN so each block starts as the identity: stable at lr 0.1 from step 1.
        nn.init.zeros_(self.bn3.weight)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_ch != out_ch:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False), nn.BatchNorm2d(out_ch)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    """Stem (7x7/2 conv, 3x3/2 max-pool), four bottleneck stages, global pool, linear head."""

    def __init__(
        self, blocks: Sequence[int], *, base_width: int = 64, num_classes: int = 1000
    ) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, base_width, 7, stride=2, padding=3, bias=False),
            nn.BatchNorm2d(base_width),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, stride=2, padding=1),
        )
        stages = []
        in_ch = base_width
        for i, n in enumerate(blocks):
            width = base_width * 2**i
            layers = []
            for j in range(n):
                layers.append(Bottleneck(in_ch, width, stride=2 if (i > 0 and j == 0) else 1))
                in_ch = width * Bottleneck.expansion
            stages.append(nn.Sequential(*layers))
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_ch, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(x))
        return self.fc(torch.flatten(self.pool(x), 1))


def resnet50(num_classes: int = 1000) -> ResNet:
    """Blocks [3, 4, 6, 3], widths 64..2048: 25,557,032 parameters at 1000 classes."""
    return ResNet((3, 4, 6, 3), base_width=64, num_classes=num_classes)


def tiny_resnet(num_classes: int = 10) -> ResNet:
    """One block per stage, base width 8: the same code path, cheap enough for a CPU test."""
    return ResNet((1, 1, 1, 1), base_width=8, num_classes=num_classes)


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


class TrainStep:
    """Model, SGD, cross-entropy; channels_last, bf16 autocast on CUDA: what a loader feeds."""

    def __init__(self, model: nn.Module, device: torch.device | str, *, lr: float = 0.1) -> None:
        self.device = torch.device(device)
        self.model = model.to(self.device, memory_format=torch.channels_last)
        self.params = count_parameters(self.model)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=lr, momentum=0.9, weight_decay=5e-5)
        self.amp = self.device.type == "cuda"

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One optimiser step on (x, y); returns the loss without waiting for it."""
        x = x.contiguous(memory_format=torch.channels_last)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.amp):
            loss = F.cross_entropy(self.model(x), y)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return loss.detach()
