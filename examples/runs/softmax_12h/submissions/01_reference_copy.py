import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        for i in range(x.shape[0]):
            row = x[i]
            exp = torch.exp(row - row.max())
            out[i] = exp / exp.sum()
        return out
