import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """One fused addmm, then an in-place clamp."""

    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return torch.addmm(self.linear.bias, x, self.linear.weight.t()).clamp_min_(0)
