import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Numerically stable softmax with in-place exp and divide."""

    def forward(self, x):
        out = x - x.amax(dim=-1, keepdim=True)
        out.exp_()
        return out.div_(out.sum(dim=-1, keepdim=True))
