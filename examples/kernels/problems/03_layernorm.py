"""Layer normalisation with learned affine parameters."""

import torch
import torch.nn as nn

batch_size, features = 256, 1024

AGENTINFRA = {"bytes": 2 * 4 * batch_size * features, "shape_variants": [{"batch_size": 17}]}


class Model(nn.Module):
    def __init__(self, features: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(features)
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


def get_inputs():
    return [torch.randn(batch_size, features)]


def get_init_inputs():
    return [features]
