"""Softmax computed one row at a time in Python: a deliberately inefficient reference."""

import torch
import torch.nn as nn

rows, cols = 256, 512

AGENTINFRA = {"bytes": 2 * 4 * rows * cols, "shape_variants": [{"rows": 45}]}


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        for i in range(x.shape[0]):
            row = x[i]
            shifted = row - row.max()
            exp = torch.exp(shifted)
            out[i] = exp / exp.sum()
        return out


def get_inputs():
    return [torch.randn(rows, cols)]


def get_init_inputs():
    return []
