import torch.nn as nn


class ModelNew(nn.Module):
    """Final: one fused softmax over the last dimension."""

    def forward(self, x):
        return x.softmax(-1)
