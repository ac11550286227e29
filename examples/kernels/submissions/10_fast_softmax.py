import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """All rows at once instead of a Python loop: a genuine large speedup."""

    def forward(self, x):
        return torch.softmax(x, dim=-1)
