"""Cumulative sum along columns with a Python loop: a deliberately inefficient reference."""

import torch
import torch.nn as nn

batch_size, length = 128, 256

AGENTINFRA = {"bytes": 2 * 4 * batch_size * length, "atol": 1e-5, "shape_variants": [{"length": 100}]}


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        running = torch.zeros(x.shape[0], dtype=x.dtype)
        for j in range(x.shape[1]):
            running = running + x[:, j]
            out[:, j] = running
        return out


def get_inputs():
    return [torch.randn(batch_size, length)]


def get_init_inputs():
    return []
