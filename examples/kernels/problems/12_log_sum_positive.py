"""Sum of logarithms of positive inputs: sign-flipped inputs are not in its domain."""

import torch
import torch.nn as nn

batch_size, dim = 256, 2048

AGENTINFRA = {"bytes": 4 * batch_size * dim}


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x).sum(dim=1)


def get_inputs():
    return [torch.rand(batch_size, dim) + 0.1]


def get_init_inputs():
    return []
