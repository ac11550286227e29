"""ReLU then scale on a 1024x1024 input: a fast one-liner whose timed calls take well under a millisecond."""

import torch
import torch.nn as nn

size = 1024

AGENTINFRA = {"bytes": 2 * 4 * size * size, "flops": 2 * size * size}


class Model(nn.Module):
    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * self.scale


def get_inputs():
    return [torch.randn(size, size)]


def get_init_inputs():
    return [0.5]
