"""Built-in Flax linen models whose layers are not a chain: a U-Net and a DenseNet."""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax.numpy as jnp


class ConvBlock(nn.Module):
  """Two 3x3 convs with ReLU (one U-Net level)."""

  features: int

  @nn.compact
  def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
    x = nn.relu(nn.Conv(self.features, (3, 3))(x))
    return nn.relu(nn.Conv(self.features, (3, 3))(x))


def _upsample_2x(x: jnp.ndarray) -> jnp.ndarray:
  return jnp.repeat(jnp.repeat(x, 2, axis=1), 2, axis=2)


class UNet(nn.Module):
  """A small U-Net (Ronneberger et al. 2015): each encoder level's output skips to the
  decoder level of the same resolution, where it is concatenated with the upsampled
  features; the skips stay alive across every layer in between.

  Attributes:
    features: channels per level, top to bottom (the last is the bottleneck).
    num_classes: output channels (per pixel).
  """

  features: Sequence[int] = (8, 16, 32)
  num_classes: int = 2

  @nn.compact
  def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
    skips = []
    for level, f in enumerate(self.features[:-1]):
      x = ConvBlock(f, name=f"down_{level}")(x)
      skips.append(x)
      x = nn.avg_pool(x, (2, 2), strides=(2, 2))
    x = ConvBlock(self.features[-1], name="bottom")(x)
    for level in reversed(range(len(self.features) - 1)):
      x = jnp.concatenate([_upsample_2x(x), skips[level]], axis=-1)
      x = ConvBlock(self.features[level], name=f"up_{level}")(x)
    return nn.Conv(self.num_classes, (1, 1), name="head")(x)


class DenseLayer(nn.Module):
  """A DenseNet layer: concatenates every earlier feature map, then a 3x3 conv and ReLU."""

  growth: int

  @nn.compact
  def __call__(self, features: Sequence[jnp.ndarray]) -> jnp.ndarray:
    return nn.relu(nn.Conv(self.growth, (3, 3))(jnp.concatenate(features, axis=-1)))


class DenseNet(nn.Module):
  """A DenseNet-style stack (Huang et al. 2017): within a block each layer reads all the
  feature maps before it; a 1x1 conv and 2x2 average pool join the blocks.

  Attributes:
    blocks: layers per dense block.
    growth: channels each layer adds.
    stem: channels of the first conv.
    num_classes: classifier outputs.
  """

  blocks: Sequence[int] = (4, 4)
  growth: int = 8
  stem: int = 16
  num_classes: int = 10

  @nn.compact
  def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
    x = nn.Conv(self.stem, (3, 3), name="stem")(x)
    for b, count in enumerate(self.blocks):
      features = [x]
      for k in range(count):
        features.append(DenseLayer(self.growth, name=f"block{b}_layer{k}")(features))
      x = jnp.concatenate(features, axis=-1)
      if b < len(self.blocks) - 1:
        x = nn.Conv(x.shape[-1] // 2, (1, 1), name=f"transition{b}")(x)
        x = nn.avg_pool(x, (2, 2), strides=(2, 2))
    return nn.Dense(self.num_classes, name="head")(jnp.mean(x, axis=(1, 2)))
