"""Softmax over the last dimension (KernelBench level-1 style)."""

import torch
import torch.nn as nn

batch_size, dim = 128, 4096

AGENTINFRA = {"bytes": 2 * 4 * batch_size * dim, "shape_variants": [{"batch_size": 33, "dim": 1000}]}


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=-1)


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
