"""Divide a tensor by its Frobenius norm (KernelBench level-1 #37 style)."""

import torch
import torch.nn as nn

batch_size, features, dim1, dim2 = 16, 64, 32, 32

AGENTINFRA = {"bytes": 3 * 4 * batch_size * features * dim1 * dim2}


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / torch.norm(x, p="fro")


def get_inputs():
    return [torch.randn(batch_size, features, dim1, dim2)]


def get_init_inputs():
    return []
