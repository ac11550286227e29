"""Elementwise GELU, bias add and scale (fusion target, KernelBench level-2 style)."""

import torch
import torch.nn as nn

batch_size, features = 512, 2048

AGENTINFRA = {"bytes": 2 * 4 * batch_size * features}


class Model(nn.Module):
    def __init__(self, features: int, scale: float) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.randn(features))
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x + self.bias) * self.scale


def get_inputs():
    return [torch.randn(batch_size, features)]


def get_init_inputs():
    return [features, 0.5]
