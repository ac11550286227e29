"""Sum reduction over one dimension."""

import torch
import torch.nn as nn

batch_size, dim1, dim2 = 64, 512, 256

AGENTINFRA = {"bytes": 4 * batch_size * dim1 * dim2, "shape_variants": [{"dim1": 129}]}


class Model(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sum(x, dim=self.dim, keepdim=True)


def get_inputs():
    return [torch.randn(batch_size, dim1, dim2)]


def get_init_inputs():
    return [1]
