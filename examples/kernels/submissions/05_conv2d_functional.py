import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    """The same convolution through the functional API."""

    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)

    def forward(self, x):
        return F.conv2d(x, self.conv.weight, self.conv.bias)
