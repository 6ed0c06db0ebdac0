"""Built-in Flax linen models (chains of layers) for the demo, tests and benchmarks."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import flax.linen as nn
import jax.numpy as jnp

VGG_CONFIGS: dict[str, tuple[int | str, ...]] = {
    "vgg11": (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"),
    "vgg16": (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"),
    "vgg19": (64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M",
              512, 512, 512, 512, "M"),
}


def flatten(x: jnp.ndarray) -> jnp.ndarray:
  """Flattens all but the leading (batch) axis."""
  return x.reshape(x.shape[0], -1)


max_pool_2x2 = functools.partial(nn.max_pool, window_shape=(2, 2), strides=(2, 2))


def vgg(
    name: str = "vgg11",
    *,
    width: float = 1.0,
    num_classes: int = 10,
    hidden: int = 512,
    dtype: jnp.dtype | None = None,
) -> nn.Sequential:
  """A VGG network (Simonyan & Zisserman 2014) as an ``nn.Sequential`` chain.

  Args:
    name: ``"vgg11"``, ``"vgg16"`` or ``"vgg19"``.
    width: multiplier on every conv's channel count (``0.25`` for quick CPU runs).
    num_classes: classifier outputs.
    hidden: width of the two hidden classifier layers.
    dtype: compute dtype of the convs and dense layers (e.g. ``jnp.bfloat16``).
  """
  layers: list = []
  for item in VGG_CONFIGS[name]:
    if item == "M":
      layers.append(max_pool_2x2)
    else:
      layers += [nn.Conv(max(1, int(item * width)), (3, 3), dtype=dtype), nn.relu]
  layers += [flatten, nn.Dense(hidden, dtype=dtype), nn.relu, nn.Dense(hidden, dtype=dtype),
             nn.relu, nn.Dense(num_classes, dtype=dtype)]
  return nn.Sequential(layers)


def mlp(widths: Sequence[int], *, dtype: jnp.dtype | None = None) -> nn.Sequential:
  """Dense layers of the given (possibly uneven) widths with ReLU between them."""
  layers: list = []
  for k, w in enumerate(widths):
    layers.append(nn.Dense(w, dtype=dtype))
    if k < len(widths) - 1:
      layers.append(nn.relu)
  return nn.Sequential(layers)


class ResidualBlock(nn.Module):
  """A ResNet basic block (two 3x3 convs with BatchNorm) whose skip stays inside it."""

  features: int
  strides: int = 1
  train: bool = True

  @nn.compact
  def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
    norm = functools.partial(nn.BatchNorm, use_running_average=not self.train, momentum=0.9)
    y = nn.Conv(self.features, (3, 3), strides=self.strides, use_bias=False)(x)
    y = nn.relu(norm()(y))
    y = nn.Conv(self.features, (3, 3), use_bias=False)(y)
    y = norm(scale_init=nn.initializers.zeros)(y)
    if x.shape != y.shape:
      x = nn.Conv(self.features, (1, 1), strides=self.strides, use_bias=False)(x)
      x = norm()(x)
    return nn.relu(x + y)


def resnet(
    stages: Sequence[int] = (2, 2, 2, 2),
    *,
    width: int = 64,
    num_classes: int = 10,
    train: bool = True,
) -> nn.Sequential:
  """A CIFAR-style ResNet (He et al. 2016) as a chain of residual blocks.

  ``stages=(2, 2, 2, 2)`` is ResNet-18's block layout; BatchNorm runs in training mode
  when ``train`` (apply with ``mutable=["batch_stats"]``).
  """
  layers: list = [nn.Conv(width, (3, 3), use_bias=False),
                  nn.BatchNorm(use_running_average=not train, momentum=0.9), nn.relu]
  for s, blocks in enumerate(stages):
    for b in range(blocks):
      layers.append(ResidualBlock(width * 2**s, strides=2 if (b == 0 and s > 0) else 1, train=train))
  layers += [lambda x: jnp.mean(x, axis=(1, 2)), nn.Dense(num_classes)]
  return nn.Sequential(layers)


class DropoutMLP(nn.Module):
  """Dense layers with Dropout between them (needs ``rngs={"dropout": key}``)."""

  widths: Sequence[int]
  rate: float = 0.1

  @nn.compact
  def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
    for k, w in enumerate(self.widths):
      x = nn.Dense(w)(x)
      if k < len(self.widths) - 1:
        x = nn.Dropout(self.rate, deterministic=False)(nn.gelu(x))
    return x


def all_conv(
    stages: Sequence[tuple[int, int]] = ((16, 1), (16, 1), (32, 2), (32, 1), (32, 1), (64, 2),
                                         (64, 1), (64, 1), (128, 2), (128, 1)),
    *,
    num_classes: int = 10,
) -> nn.Sequential:
  """An all-convolutional net (Springenberg et al. 2015): strided convs, no pooling.

  ``stages`` lists ``(features, stride)`` per 3x3 conv, each followed by ReLU.
  """
  layers: list = []
  for features, stride in stages:
    layers += [nn.Conv(features, (3, 3), strides=stride), nn.relu]
  layers += [flatten, nn.Dense(num_classes)]
  return nn.Sequential(layers)
