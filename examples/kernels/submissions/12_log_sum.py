import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Same math; log of a product would overflow, so stay with a sum of logs."""

    def forward(self, x):
        return torch.log(x).sum(dim=1)
