"""Standard 2D convolution, square kernel."""

import torch
import torch.nn as nn

batch_size, in_channels, out_channels, kernel_size, height, width = 8, 16, 32, 3, 32, 32

AGENTINFRA = {
    "flops": 2 * batch_size * out_channels * (height - 2) * (width - 2) * in_channels * kernel_size * kernel_size,
    "shape_variants": [{"batch_size": 3, "height": 19, "width": 23}],
}


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
