"""Scaled dot-product attention written out with matmuls (attention-like)."""

import math

import torch
import torch.nn as nn

batch, heads, seq, head_dim = 2, 8, 256, 64

AGENTINFRA = {"flops": 4 * batch * heads * seq * seq * head_dim, "atol": 1e-4, "shape_variants": [{"seq": 77}]}


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        return torch.softmax(scores, dim=-1) @ v


def get_inputs():
    return [torch.randn(batch, heads, seq, head_dim) for _ in range(3)]


def get_init_inputs():
    return []
