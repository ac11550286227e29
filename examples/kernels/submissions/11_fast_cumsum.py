import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """One cumsum kernel instead of a Python loop over columns."""

    def forward(self, x):
        return torch.cumsum(x, dim=1)
