"""Matrix multiplication followed by ReLU (KernelBench level-2 style)."""

import torch
import torch.nn as nn

M, K, N = 256, 512, 256

AGENTINFRA = {
    "flops": 2 * M * K * N,
    "bytes": 4 * (M * K + K * N + M * N),
    "shape_variants": [{"M": 67}],
}


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))


def get_inputs():
    return [torch.randn(M, K)]


def get_init_inputs():
    return [K, N]
