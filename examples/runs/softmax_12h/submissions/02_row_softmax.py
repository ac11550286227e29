import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        for i in range(x.shape[0]):
            out[i] = torch.softmax(x[i], dim=0)
        return out
