"""Mean squared error between predictions and targets (a scalar output)."""

import torch
import torch.nn as nn

batch_size, dim = 1024, 1024

AGENTINFRA = {"bytes": 2 * 4 * batch_size * dim}


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return torch.mean((predictions - targets) ** 2)


def get_inputs():
    return [torch.randn(batch_size, dim), torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
