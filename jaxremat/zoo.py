"""Built-in Flax linen models (chains of layers) for the demo, tests and benchmarks."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import flax.linen as nn
import jax
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
      assert isinstance(item, int)  # a conv's channel count
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
  dtype: jnp.dtype | None = None

  @nn.compact
  def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
    norm = functools.partial(nn.BatchNorm, use_running_average=not self.train, momentum=0.9,
                             dtype=self.dtype)
    conv = functools.partial(nn.Conv, use_bias=False, dtype=self.dtype)
    y = conv(self.features, (3, 3), strides=self.strides)(x)
    y = nn.relu(norm()(y))
    y = conv(self.features, (3, 3))(y)
    y = norm(scale_init=nn.initializers.zeros)(y)
    if x.shape != y.shape:
      x = conv(self.features, (1, 1), strides=self.strides)(x)
      x = norm()(x)
    return nn.relu(x + y)


class BottleneckBlock(nn.Module):
  """A ResNet bottleneck block (1x1, 3x3, 1x1 convs with BatchNorm; output ``4 * features``
  channels) whose skip stays inside it."""

  features: int
  strides: int = 1
  train: bool = True
  dtype: jnp.dtype | None = None

  @nn.compact
  def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
    norm = functools.partial(nn.BatchNorm, use_running_average=not self.train, momentum=0.9,
                             dtype=self.dtype)
    conv = functools.partial(nn.Conv, use_bias=False, dtype=self.dtype)
    y = nn.relu(norm()(conv(self.features, (1, 1))(x)))
    y = nn.relu(norm()(conv(self.features, (3, 3), strides=self.strides)(y)))
    y = norm(scale_init=nn.initializers.zeros)(conv(4 * self.features, (1, 1))(y))
    if x.shape != y.shape:
      x = norm()(conv(4 * self.features, (1, 1), strides=self.strides)(x))
    return nn.relu(x + y)


def global_avg_pool(x: jnp.ndarray) -> jnp.ndarray:
  """Means over the spatial axes of an NHWC batch."""
  return jnp.mean(x, axis=(1, 2))


#: name -> (blocks per stage, block kind), He et al. 2016, Table 1.
RESNET_CONFIGS: dict[str, tuple[tuple[int, ...], str]] = {
    "resnet18": ((2, 2, 2, 2), "basic"),
    "resnet34": ((3, 4, 6, 3), "basic"),
    "resnet50": ((3, 4, 6, 3), "bottleneck"),
    "resnet101": ((3, 4, 23, 3), "bottleneck"),
    "resnet152": ((3, 8, 36, 3), "bottleneck"),
}


def resnet(
    stages: Sequence[int] = (2, 2, 2, 2),
    *,
    width: int = 64,
    num_classes: int = 10,
    train: bool = True,
    block: str = "basic",
    stem: str = "cifar",
    dtype: jnp.dtype | None = None,
) -> nn.Sequential:
  """A ResNet (He et al. 2016) as a chain: stem layers, residual blocks, head layers.

  ``stages=(2, 2, 2, 2)`` is ResNet-18's block layout; BatchNorm runs in training mode
  when ``train`` (apply with ``mutable=["batch_stats"]``).

  Args:
    stages: blocks per stage; stage ``s`` has ``width * 2**s`` base channels and every
      stage after the first starts with a stride-2 block.
    width: base channels of the first stage (64 in the paper).
    num_classes: classifier outputs.
    train: BatchNorm uses batch statistics (and updates ``batch_stats``).
    block: ``"basic"`` (two 3x3 convs) or ``"bottleneck"`` (1x1, 3x3, 1x1; 4x wider out).
    stem: ``"cifar"`` (3x3 conv, stride 1) or ``"imagenet"`` (7x7 conv stride 2, then
      3x3 max-pool stride 2), each followed by BatchNorm and ReLU.
    dtype: compute dtype of convs, BatchNorm and the classifier.
  """
  kinds = {"basic": ResidualBlock, "bottleneck": BottleneckBlock}
  if block not in kinds:
    raise ValueError(f"block must be one of {sorted(kinds)}, got {block!r}.")
  if stem not in ("cifar", "imagenet"):
    raise ValueError(f"stem must be 'cifar' or 'imagenet', got {stem!r}.")
  big = stem == "imagenet"
  layers: list = [nn.Conv(width, (7, 7) if big else (3, 3), strides=2 if big else 1, use_bias=False,
                          dtype=dtype),
                  nn.BatchNorm(use_running_average=not train, momentum=0.9, dtype=dtype), nn.relu]
  if big:
    layers.append(functools.partial(nn.max_pool, window_shape=(3, 3), strides=(2, 2),
                                    padding="SAME"))
  for s, blocks in enumerate(stages):
    for b in range(blocks):
      layers.append(kinds[block](width * 2**s, strides=2 if (b == 0 and s > 0) else 1, train=train,
                                 dtype=dtype))
  layers += [global_avg_pool, nn.Dense(num_classes, dtype=dtype)]
  return nn.Sequential(layers)


def resnet_by_name(
    name: str = "resnet18",
    *,
    width: float = 1.0,
    depth: float = 1.0,
    num_classes: int = 10,
    stem: str = "cifar",
    train: bool = True,
    dtype: jnp.dtype | None = None,
) -> nn.Sequential:
  """ResNet-18/34/50/101/152 by name, with width and depth multipliers for small runs.

  Args:
    name: a key of ``RESNET_CONFIGS``.
    width: multiplier on every stage's channels (64 base channels at ``1.0``).
    depth: multiplier on the blocks per stage (at least one block each).
    num_classes, stem, train, dtype: as in ``resnet``.
  """
  if name not in RESNET_CONFIGS:
    raise ValueError(f"unknown ResNet {name!r}; expected one of {sorted(RESNET_CONFIGS)}.")
  stages, block = RESNET_CONFIGS[name]
  return resnet(tuple(max(1, round(n * depth)) for n in stages), width=max(1, round(64 * width)),
                num_classes=num_classes, train=train, block=block, stem=stem, dtype=dtype)


class PatchEmbed(nn.Module):
  """Cuts an NHWC image into ``patch x patch`` patches, projects each to ``dim`` and adds
  a learned position embedding: ``(batch, patches, dim)``."""

  patch: int
  dim: int
  dtype: jnp.dtype | None = None

  @nn.compact
  def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
    x = nn.Conv(self.dim, (self.patch, self.patch), strides=self.patch, padding="VALID",
                dtype=self.dtype)(x)
    x = x.reshape(x.shape[0], -1, self.dim)
    pos = self.param("pos_embedding", nn.initializers.normal(0.02), x.shape[1:])
    return x + pos[None].astype(x.dtype)


class TokenEmbed(nn.Module):
  """Embeds integer tokens ``(batch, seq)`` and adds a learned position embedding."""

  vocab_size: int
  dim: int
  max_len: int
  dtype: jnp.dtype | None = None

  @nn.compact
  def __call__(self, tokens: jnp.ndarray) -> jnp.ndarray:
    x = nn.Embed(self.vocab_size, self.dim, dtype=self.dtype)(tokens)
    pos = self.param("pos_embedding", nn.initializers.normal(0.02), (self.max_len, self.dim))
    return x + pos[None, : tokens.shape[1]].astype(x.dtype)


class TransformerBlock(nn.Module):
  """A pre-LN transformer block: ``x + MHA(LN(x))``, then ``x + MLP(LN(x))``."""

  num_heads: int
  mlp_dim: int
  causal: bool = False
  dtype: jnp.dtype | None = None

  @nn.compact
  def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
    mask = nn.make_causal_mask(jnp.ones(x.shape[:2], jnp.int32)) if self.causal else None
    y = nn.LayerNorm(dtype=self.dtype)(x)
    x = x + nn.MultiHeadDotProductAttention(self.num_heads, dtype=self.dtype)(y, y, mask=mask)
    y = nn.LayerNorm(dtype=self.dtype)(x)
    y = nn.gelu(nn.Dense(self.mlp_dim, dtype=self.dtype)(y))
    y = nn.Dense(x.shape[-1], dtype=self.dtype)(y)
    return x + y


class _ScannedBlock(TransformerBlock):
  """A ``TransformerBlock`` with ``nn.scan``'s signature: ``(carry, x) -> (carry, y)``."""

  @nn.compact
  def __call__(self, x: jnp.ndarray, _: None) -> tuple[jnp.ndarray, None]:  # type: ignore[override]
    return TransformerBlock.__call__(self, x), None


class ScannedBlocks(nn.Module):
  """``depth`` pre-LN blocks as one ``nn.scan`` over stacked parameters (the layout of
  MaxText and large Flax models)."""

  depth: int
  num_heads: int
  mlp_dim: int
  causal: bool = False
  dtype: jnp.dtype | None = None

  @nn.compact
  def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
    stack = nn.scan(_ScannedBlock, variable_axes={"params": 0}, split_rngs={"params": True},
                    length=self.depth)
    x, _ = stack(self.num_heads, self.mlp_dim, self.causal, self.dtype, name="blocks")(x, None)
    return x


def mean_over_tokens(x: jnp.ndarray) -> jnp.ndarray:
  """Means a ``(batch, seq, dim)`` array over its tokens."""
  return jnp.mean(x, axis=1)


def vit(
    *,
    patch: int = 4,
    dim: int = 192,
    depth: int = 12,
    num_heads: int = 3,
    mlp_ratio: int = 4,
    num_classes: int = 10,
    causal: bool = False,
    dtype: jnp.dtype | None = None,
) -> nn.Sequential:
  """A ViT (Dosovitskiy et al. 2021) as a chain: patchify, ``depth`` pre-LN blocks, final
  LayerNorm, mean over tokens, classifier. The sequence length is the number of patches
  of the input image (``(32 // 4) ** 2 = 64`` for CIFAR at ``patch=4``)."""
  blocks = [TransformerBlock(num_heads, mlp_ratio * dim, causal=causal, dtype=dtype)
            for _ in range(depth)]
  return nn.Sequential([PatchEmbed(patch, dim, dtype=dtype), *blocks, nn.LayerNorm(dtype=dtype),
                        mean_over_tokens, nn.Dense(num_classes, dtype=dtype)])


def gpt(
    *,
    vocab_size: int = 256,
    max_len: int = 128,
    dim: int = 128,
    depth: int = 4,
    num_heads: int = 4,
    mlp_ratio: int = 4,
    causal: bool = True,
    dtype: jnp.dtype | None = None,
    scan: bool = False,
) -> nn.Sequential:
  """A GPT-style decoder as a chain: token + position embedding, ``depth`` pre-LN blocks
  (causal attention; with ``scan``, one ``nn.scan`` over them), final LayerNorm,
  per-token logits over ``vocab_size``. Input: integer tokens ``(batch, seq)`` with
  ``seq <= max_len``."""
  blocks: list[nn.Module] = (
      [ScannedBlocks(depth, num_heads, mlp_ratio * dim, causal=causal, dtype=dtype)] if scan
      else [TransformerBlock(num_heads, mlp_ratio * dim, causal=causal, dtype=dtype)
            for _ in range(depth)])
  return nn.Sequential([TokenEmbed(vocab_size, dim, max_len, dtype=dtype), *blocks,
                        nn.LayerNorm(dtype=dtype), nn.Dense(vocab_size, dtype=dtype)])


def remat_layers(model: nn.Sequential, policy=None) -> nn.Sequential:
  """The same ``Sequential`` with every layer rematerialised the Flax way.

  Each module layer is rebuilt from ``nn.remat`` of its class (same fields, so the
  variables tree is unchanged); plain functions (``nn.relu``, ``flatten``) are wrapped in
  ``jax.checkpoint``.

  Args:
    model: a ``Sequential`` of modules and functions.
    policy: a ``jax.checkpoint_policies`` policy for every layer (default: save nothing
      but the layer's input).
  """
  layers: list = []
  for layer in model.layers:
    if isinstance(layer, nn.Module):
      fields = {f.name: getattr(layer, f.name) for f in dataclasses.fields(layer)
                if f.init and f.name not in ("parent", "name")}
      layers.append(nn.remat(type(layer), policy=policy)(**fields))
    else:
      layers.append(jax.checkpoint(layer, policy=policy))
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
