import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.cat([torch.softmax(chunk, dim=-1) for chunk in x.split(16)])
