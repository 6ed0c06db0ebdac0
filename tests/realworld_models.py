"""Small Flax models written the way real code writes them (not ``jaxremat.zoo``'s chains).

Each family nests its repeated blocks one level below the root module, as the public code
it imitates does: a ViT whose blocks sit in an ``Encoder`` (google-research/
vision_transformer), a decoder-only LM whose blocks sit in a ``Decoder`` and read an
attention mask built from the tokens at the root (flax examples/lm1b), an encoder-decoder
whose decoder blocks read the encoder's output (flax examples/wmt), a ResNet whose
blocks sit in stage modules, a U-Net whose blocks sit in an encoder and a decoder (its
skips make it a graph), a linen LM whose blocks are an ``nn.scan`` inside a child,
and an nnx MiniGPT whose blocks sit in an ``nnx.Sequential`` or in a child holding an
``nnx.List`` (the Flax docs' MiniGPT). Each takes ``remat=True`` to rematerialise every
block the framework's way (``nn.remat``, ``nnx.remat``), with the same variables.

``build(name, size)`` returns a ``Case``: the model, its batch, how to call it, and the
names of its blocks as the layers jaxremat should find; ``apply`` and ``footprint`` run
jaxremat and XLA on it the same way for linen and nnx.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import jaxremat

# ------------------------------------------------------------------ linen: ViT


class MlpBlock(nn.Module):
  """Dense, GELU, Dropout, Dense, Dropout."""

  mlp_dim: int
  dropout_rate: float = 0.1

  @nn.compact
  def __call__(self, inputs: jax.Array, *, deterministic: bool) -> jax.Array:
    x = nn.gelu(nn.Dense(self.mlp_dim)(inputs))
    x = nn.Dropout(self.dropout_rate)(x, deterministic=deterministic)
    x = nn.Dense(inputs.shape[-1])(x)
    return nn.Dropout(self.dropout_rate)(x, deterministic=deterministic)


class Encoder1DBlock(nn.Module):
  """Pre-LN encoder block: attention (with attention dropout), then the MLP."""

  mlp_dim: int
  num_heads: int
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.0  # as in the ViT-B/16 configurations

  @nn.compact
  def __call__(self, inputs: jax.Array, deterministic: bool) -> jax.Array:
    x = nn.LayerNorm()(inputs)
    x = nn.MultiHeadDotProductAttention(
        num_heads=self.num_heads, dropout_rate=self.attention_dropout_rate,
        deterministic=deterministic, broadcast_dropout=False)(x, x)
    x = nn.Dropout(self.dropout_rate)(x, deterministic=deterministic)
    x = x + inputs
    y = nn.LayerNorm()(x)
    y = MlpBlock(self.mlp_dim, self.dropout_rate)(y, deterministic=deterministic)
    return x + y


class AddPositionEmbs(nn.Module):
  """Adds a learned position embedding."""

  @nn.compact
  def __call__(self, inputs: jax.Array) -> jax.Array:
    shape = (1, inputs.shape[1], inputs.shape[2])
    return inputs + self.param("pos_embedding", nn.initializers.normal(0.02), shape)


class Encoder(nn.Module):
  """Position embedding, dropout, ``num_layers`` blocks, final LayerNorm."""

  num_layers: int
  mlp_dim: int
  num_heads: int
  dropout_rate: float = 0.1
  remat: bool = False

  @nn.compact
  def __call__(self, x: jax.Array, *, train: bool) -> jax.Array:
    x = AddPositionEmbs(name="posembed_input")(x)
    x = nn.Dropout(self.dropout_rate)(x, deterministic=not train)
    block = nn.remat(Encoder1DBlock, static_argnums=(2,)) if self.remat else Encoder1DBlock
    for lyr in range(self.num_layers):
      x = block(self.mlp_dim, self.num_heads, self.dropout_rate, name=f"encoderblock_{lyr}")(
          x, not train)
    return nn.LayerNorm(name="encoder_norm")(x)


class VisionTransformer(nn.Module):
  """Patch embedding, class token, ``Encoder`` (named ``Transformer``), head on the token."""

  num_classes: int
  patch: int
  hidden: int
  num_layers: int
  num_heads: int
  mlp_dim: int
  remat: bool = False

  @nn.compact
  def __call__(self, inputs: jax.Array, *, train: bool) -> jax.Array:
    x = nn.Conv(self.hidden, (self.patch, self.patch), strides=self.patch, padding="VALID",
                name="embedding")(inputs)
    n, h, w, c = x.shape
    x = x.reshape(n, h * w, c)
    cls = jnp.tile(self.param("cls", nn.initializers.zeros, (1, 1, c)), (n, 1, 1))
    x = jnp.concatenate([cls, x], axis=1)
    x = Encoder(self.num_layers, self.mlp_dim, self.num_heads, remat=self.remat,
                name="Transformer")(x, train=train)
    return nn.Dense(self.num_classes, name="head")(x[:, 0])


# ------------------------------------------------------------------ linen: lm1b-like LM


def shift_right(x: jax.Array) -> jax.Array:
  """Shifts tokens one step right along the sequence, padding with 0."""
  return jnp.pad(x, ((0, 0), (1, 0)))[:, :-1]


def sinusoidal_table(max_len: int, dim: int) -> np.ndarray:
  """A fixed sinusoidal position table ``(1, max_len, dim)`` (a constant, not learned)."""
  position = np.arange(max_len)[:, None]
  div = np.exp(np.arange(0, dim // 2) * -(np.log(10000.0) / (dim // 2 - 1)))
  table = np.zeros((max_len, dim), np.float32)
  table[:, : dim // 2] = np.sin(position * div)
  table[:, dim // 2 : 2 * (dim // 2)] = np.cos(position * div)
  return table[None]


class LmMlpBlock(nn.Module):
  """Dense, ReLU, Dropout, Dense, Dropout."""

  mlp_dim: int
  dropout_rate: float
  deterministic: bool

  @nn.compact
  def __call__(self, inputs: jax.Array) -> jax.Array:
    x = nn.Dropout(self.dropout_rate)(nn.relu(nn.Dense(self.mlp_dim)(inputs)),
                                      deterministic=self.deterministic)
    x = nn.Dense(inputs.shape[-1])(x)
    return nn.Dropout(self.dropout_rate)(x, deterministic=self.deterministic)


class DecoderBlock(nn.Module):
  """Pre-LN decoder block reading the attention mask it is given."""

  num_heads: int
  mlp_dim: int
  dropout_rate: float
  deterministic: bool

  @nn.compact
  def __call__(self, inputs: jax.Array, decoder_mask: jax.Array) -> jax.Array:
    x = nn.LayerNorm()(inputs)
    x = nn.MultiHeadDotProductAttention(
        num_heads=self.num_heads, use_bias=False, broadcast_dropout=False,
        dropout_rate=self.dropout_rate, deterministic=self.deterministic)(x, mask=decoder_mask)
    x = nn.Dropout(self.dropout_rate)(x, deterministic=self.deterministic) + inputs
    z = LmMlpBlock(self.mlp_dim, self.dropout_rate, self.deterministic)(nn.LayerNorm()(x))
    return x + z


class Decoder(nn.Module):
  """Shifted-token embedding, fixed positions, dropout, blocks, LayerNorm, logits."""

  vocab_size: int
  emb_dim: int
  num_layers: int
  num_heads: int
  mlp_dim: int
  max_len: int
  dropout_rate: float = 0.1
  deterministic: bool = False
  remat: bool = False

  @nn.compact
  def __call__(self, inputs: jax.Array, decoder_mask: jax.Array) -> jax.Array:
    y = nn.Embed(self.vocab_size, self.emb_dim)(shift_right(inputs.astype(jnp.int32)))
    y = y + sinusoidal_table(self.max_len, self.emb_dim)[:, : inputs.shape[1]]
    y = nn.Dropout(self.dropout_rate)(y, deterministic=self.deterministic)
    block = nn.remat(DecoderBlock) if self.remat else DecoderBlock
    for lyr in range(self.num_layers):
      y = block(self.num_heads, self.mlp_dim, self.dropout_rate, self.deterministic,
                name=f"encoderdecoderblock_{lyr}")(y, decoder_mask)
    y = nn.LayerNorm(name="encoderdecoder_norm")(y)
    return nn.Dense(self.vocab_size, name="logitdense")(y)


class TransformerLM(nn.Module):
  """A padding and causal mask built from the tokens at the root, then the ``Decoder``."""

  vocab_size: int
  emb_dim: int
  num_layers: int
  num_heads: int
  mlp_dim: int
  max_len: int
  deterministic: bool = False
  remat: bool = False

  @nn.compact
  def __call__(self, inputs: jax.Array) -> jax.Array:
    decoder_mask = nn.combine_masks(
        nn.make_attention_mask(inputs > 0, inputs > 0), nn.make_causal_mask(inputs))
    return Decoder(self.vocab_size, self.emb_dim, self.num_layers, self.num_heads,
                   self.mlp_dim, self.max_len, deterministic=self.deterministic,
                   remat=self.remat, name="decoder")(inputs, decoder_mask)


# ------------------------------------------------------------------ linen: wmt-like seq2seq


class CrossBlock(nn.Module):
  """Pre-LN decoder block of an encoder-decoder: causal self-attention, attention to the
  encoder's output, MLP; each added to its input."""

  num_heads: int
  mlp_dim: int
  dropout_rate: float
  deterministic: bool

  @nn.compact
  def __call__(self, targets: jax.Array, encoded: jax.Array, decoder_mask: jax.Array
               ) -> jax.Array:
    attention = functools.partial(
        nn.MultiHeadDotProductAttention, num_heads=self.num_heads, broadcast_dropout=False,
        dropout_rate=self.dropout_rate, deterministic=self.deterministic)
    drop = functools.partial(nn.Dropout(self.dropout_rate), deterministic=self.deterministic)
    x = nn.LayerNorm()(targets)
    x = drop(attention(name="self_attn")(x, mask=decoder_mask)) + targets
    y = drop(attention(name="cross_attn")(nn.LayerNorm()(x), encoded)) + x
    return y + LmMlpBlock(self.mlp_dim, self.dropout_rate, self.deterministic)(nn.LayerNorm()(y))


class Seq2Seq(nn.Module):
  """An encoder and a decoder as Flax's examples/wmt nests them: a shared embedding, blocks
  in an ``encoder`` and a ``decoder`` (every decoder block reads the encoder's output:
  the layers make a graph), logits through the embedding."""

  vocab_size: int
  emb_dim: int
  num_layers: int
  num_heads: int
  mlp_dim: int
  max_len: int
  deterministic: bool = False
  remat: bool = False

  def setup(self) -> None:
    self.embed = nn.Embed(self.vocab_size, self.emb_dim)
    self.encoder = Seq2SeqStack(self.embed, self.num_layers, self.num_heads, self.mlp_dim,
                                self.max_len, self.deterministic, self.remat, decoder=False)
    self.decoder = Seq2SeqStack(self.embed, self.num_layers, self.num_heads, self.mlp_dim,
                                self.max_len, self.deterministic, self.remat, decoder=True)

  def __call__(self, inputs: jax.Array, targets: jax.Array) -> jax.Array:
    encoded = self.encoder(inputs)
    return self.decoder(shift_right(targets), encoded)


class Seq2SeqStack(nn.Module):
  """Embedding, fixed positions, dropout, ``num_layers`` blocks, LayerNorm; the decoder's
  blocks attend to ``encoded`` and it ends in the embedding's logits."""

  embed: nn.Embed
  num_layers: int
  num_heads: int
  mlp_dim: int
  max_len: int
  deterministic: bool
  remat: bool
  decoder: bool

  @nn.compact
  def __call__(self, tokens: jax.Array, encoded: jax.Array | None = None) -> jax.Array:
    x = self.embed(tokens.astype(jnp.int32))
    x = x + sinusoidal_table(self.max_len, x.shape[-1])[:, : tokens.shape[1]]
    x = nn.Dropout(0.1)(x, deterministic=self.deterministic)
    if self.decoder:
      mask = nn.combine_masks(nn.make_attention_mask(tokens > 0, tokens > 0),
                              nn.make_causal_mask(tokens))
      block = nn.remat(CrossBlock) if self.remat else CrossBlock
      for lyr in range(self.num_layers):
        x = block(self.num_heads, self.mlp_dim, 0.1, self.deterministic,
                  name=f"blocks_{lyr}")(x, encoded, mask)
    else:
      block = nn.remat(Encoder1DBlock, static_argnums=(2,)) if self.remat else Encoder1DBlock
      for lyr in range(self.num_layers):
        x = block(self.mlp_dim, self.num_heads, 0.1, name=f"blocks_{lyr}")(x, self.deterministic)
    x = nn.LayerNorm(name="norm")(x)
    return self.embed.attend(x) / jnp.sqrt(x.shape[-1]) if self.decoder else x


# ------------------------------------------------------------------ linen: ResNet in stages


class ResNetBlock(nn.Module):
  """Basic block: two 3x3 convs with BatchNorm, a projected shortcut when shapes change."""

  features: int
  strides: int = 1

  @nn.compact
  def __call__(self, x: jax.Array, train: bool) -> jax.Array:
    norm = functools.partial(nn.BatchNorm, use_running_average=not train, momentum=0.9)
    y = nn.Conv(self.features, (3, 3), self.strides, use_bias=False)(x)
    y = nn.relu(norm()(y))
    y = nn.Conv(self.features, (3, 3), use_bias=False)(y)
    y = norm(scale_init=nn.initializers.zeros)(y)
    if x.shape != y.shape:
      x = norm()(nn.Conv(self.features, (1, 1), self.strides, use_bias=False)(x))
    return nn.relu(x + y)


class ResNetStage(nn.Module):
  """``blocks`` blocks; the first may downsample."""

  features: int
  blocks: int
  strides: int
  remat: bool = False

  @nn.compact
  def __call__(self, x: jax.Array, train: bool) -> jax.Array:
    block = nn.remat(ResNetBlock, static_argnums=(2,)) if self.remat else ResNetBlock
    for i in range(self.blocks):
      x = block(self.features, self.strides if i == 0 else 1)(x, train)
    return x


class ResNet(nn.Module):
  """Stem (conv, BatchNorm, ReLU, max-pool), stages ``layer1..``, mean pool, classifier."""

  stage_sizes: tuple[int, ...]
  width: int
  num_classes: int = 10
  remat: bool = False

  @nn.compact
  def __call__(self, x: jax.Array, train: bool = True) -> jax.Array:
    x = nn.Conv(self.width, (3, 3), use_bias=False, name="conv_init")(x)
    x = nn.relu(nn.BatchNorm(use_running_average=not train, momentum=0.9, name="bn_init")(x))
    x = nn.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")
    for i, blocks in enumerate(self.stage_sizes):
      x = ResNetStage(self.width * 2**i, blocks, 2 if i else 1, self.remat,
                      name=f"layer{i + 1}")(x, train)
    return nn.Dense(self.num_classes)(jnp.mean(x, axis=(1, 2)))


# ------------------------------------------------------------------ linen: U-Net


class UNetBlock(nn.Module):
  """GroupNorm, SiLU, 3x3 conv, twice, and a residual add (a 1x1 conv when widths differ)."""

  features: int

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    h = nn.Conv(self.features, (3, 3))(nn.silu(nn.GroupNorm(num_groups=4)(x)))
    h = nn.Conv(self.features, (3, 3))(nn.silu(nn.GroupNorm(num_groups=4)(h)))
    if x.shape[-1] != self.features:
      x = nn.Conv(self.features, (1, 1))(x)
    return x + h


class UNetEncoder(nn.Module):
  """Per level two blocks, whose output is a skip, then a strided conv (not after the last)."""

  widths: tuple[int, ...]
  remat: bool = False

  @nn.compact
  def __call__(self, x: jax.Array) -> tuple[jax.Array, list[jax.Array]]:
    block = nn.remat(UNetBlock) if self.remat else UNetBlock
    skips = []
    for i, width in enumerate(self.widths):
      for j in range(2):
        x = block(width, name=f"down{i}_block{j}")(x)
      skips.append(x)
      if i + 1 < len(self.widths):
        x = nn.Conv(width, (3, 3), strides=2, name=f"down{i}_pool")(x)
    return x, skips


class UNetDecoder(nn.Module):
  """Per level from the deepest: the encoder's skip concatenated, two blocks, then a
  nearest-neighbour upsampling and a conv (not after the last)."""

  widths: tuple[int, ...]
  remat: bool = False

  @nn.compact
  def __call__(self, x: jax.Array, skips: list[jax.Array]) -> jax.Array:
    block = nn.remat(UNetBlock) if self.remat else UNetBlock
    for i, (width, skip) in enumerate(zip(self.widths[::-1], skips[::-1])):
      x = jnp.concatenate([x, skip], axis=-1)
      for j in range(2):
        x = block(width, name=f"up{i}_block{j}")(x)
      if i + 1 < len(self.widths):
        b, hgt, wid, c = x.shape
        x = jax.image.resize(x, (b, 2 * hgt, 2 * wid, c), "nearest")
        x = nn.Conv(self.widths[-2 - i], (3, 3), name=f"up{i}_up")(x)
    return x


class UNet(nn.Module):
  """A diffusion-style U-Net: stem, ``encoder``, a ``middle`` block, ``decoder``, head; the
  skips cross from the encoder to the decoder (a graph at the root)."""

  widths: tuple[int, ...]
  remat: bool = False

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    x = nn.Conv(self.widths[0], (3, 3), name="stem")(x)
    x, skips = UNetEncoder(self.widths, self.remat, name="encoder")(x)
    x = (nn.remat(UNetBlock) if self.remat else UNetBlock)(self.widths[-1], name="middle")(x)
    x = UNetDecoder(self.widths, self.remat, name="decoder")(x, skips)
    return nn.Conv(3, (3, 3), name="head")(nn.silu(nn.GroupNorm(num_groups=4)(x)))


# ------------------------------------------------------------------ linen: nn.scan stack


class ScannedBlock(nn.Module):
  """A pre-LN block as an ``nn.scan`` body: ``(carry, None) -> (carry, None)``."""

  num_heads: int
  mlp_dim: int

  @nn.compact
  def __call__(self, x: jax.Array, _: Any) -> tuple[jax.Array, None]:
    y = nn.LayerNorm()(x)
    x = x + nn.MultiHeadDotProductAttention(self.num_heads)(y, y)
    y = nn.Dense(x.shape[-1])(nn.gelu(nn.Dense(self.mlp_dim)(nn.LayerNorm()(x))))
    return x + y, None


class ScannedStack(nn.Module):
  """``num_layers`` blocks as one ``nn.scan`` over stacked parameters, then a LayerNorm."""

  num_layers: int
  num_heads: int
  mlp_dim: int
  remat: bool = False

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    body = nn.remat(ScannedBlock) if self.remat else ScannedBlock
    stack = nn.scan(body, variable_axes={"params": 0}, split_rngs={"params": True},
                    length=self.num_layers)
    x, _ = stack(self.num_heads, self.mlp_dim, name="layers")(x, None)
    return nn.LayerNorm(name="final_norm")(x)


class ScannedLM(nn.Module):
  """Token embedding, the scanned ``ScannedStack`` (named ``decoder``), logits."""

  vocab_size: int
  emb_dim: int
  num_layers: int
  num_heads: int
  mlp_dim: int
  remat: bool = False

  @nn.compact
  def __call__(self, tokens: jax.Array) -> jax.Array:
    x = nn.Embed(self.vocab_size, self.emb_dim, name="embed")(tokens)
    x = ScannedStack(self.num_layers, self.num_heads, self.mlp_dim, self.remat,
                     name="decoder")(x)
    return nn.Dense(self.vocab_size, name="head")(x)


# ------------------------------------------------------------------ nnx: MiniGPT


def causal_attention_mask(seq_len: int) -> jax.Array:
  return jnp.tril(jnp.ones((seq_len, seq_len)))


class TokenAndPositionEmbedding(nnx.Module):
  """Token embedding plus a learned embedding of the positions ``0..seq_len-1``."""

  def __init__(self, maxlen: int, vocab_size: int, embed_dim: int, *, rngs: nnx.Rngs):
    self.token_emb = nnx.Embed(vocab_size, embed_dim, rngs=rngs)
    self.pos_emb = nnx.Embed(maxlen, embed_dim, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    positions = jnp.arange(0, x.shape[1])[None, :]
    return self.token_emb(x) + self.pos_emb(positions)


class TransformerBlock(nnx.Module):
  """Post-LN block as in the Flax docs' MiniGPT: attention, dropout, add, LayerNorm, MLP."""

  def __init__(self, embed_dim: int, num_heads: int, ff_dim: int, *, rngs: nnx.Rngs,
               rate: float = 0.1, remat: bool = False):
    self.remat = remat
    self.mha = nnx.MultiHeadAttention(num_heads, embed_dim, decode=False, rngs=rngs)
    self.dropout1 = nnx.Dropout(rate, rngs=rngs)
    self.layer_norm1 = nnx.LayerNorm(embed_dim, rngs=rngs)
    self.linear1 = nnx.Linear(embed_dim, ff_dim, rngs=rngs)
    self.linear2 = nnx.Linear(ff_dim, embed_dim, rngs=rngs)
    self.dropout2 = nnx.Dropout(rate, rngs=rngs)
    self.layer_norm2 = nnx.LayerNorm(embed_dim, rngs=rngs)

  def __call__(self, inputs: jax.Array) -> jax.Array:
    if self.remat:
      return nnx.remat(TransformerBlock.forward)(self, inputs)
    return self.forward(inputs)

  def forward(self, inputs: jax.Array) -> jax.Array:
    mask = causal_attention_mask(inputs.shape[1])
    attention = self.dropout1(self.mha(inputs, mask=mask))
    out1 = self.layer_norm1(inputs + attention)
    ffn = self.dropout2(self.linear2(nnx.relu(self.linear1(out1))))
    return self.layer_norm2(out1 + ffn)


class BlockList(nnx.Module):
  """A child that holds the blocks in an ``nnx.List`` and runs them in order."""

  def __init__(self, blocks: list[nnx.Module]):
    self.blocks = nnx.List(blocks)

  def __call__(self, x: jax.Array) -> jax.Array:
    for block in self.blocks:
      x = block(x)
    return x


class MiniGPT(nnx.Module):
  """Embedding, ``num_blocks`` blocks in an ``nnx.Sequential`` (``container="sequential"``)
  or in a ``BlockList`` child (``container="list"``), output layer."""

  def __init__(self, maxlen: int, vocab_size: int, embed_dim: int, num_heads: int,
               feed_forward_dim: int, num_blocks: int, *, rngs: nnx.Rngs,
               container: str = "sequential", remat: bool = False):
    self.embedding_layer = TokenAndPositionEmbedding(maxlen, vocab_size, embed_dim, rngs=rngs)
    blocks = [TransformerBlock(embed_dim, num_heads, feed_forward_dim, rngs=rngs, remat=remat)
              for _ in range(num_blocks)]
    if container == "sequential":
      self.transformer_blocks = nnx.Sequential(*blocks)
    else:
      self.transformer_blocks = BlockList(blocks)
    self.output_layer = nnx.Linear(embed_dim, vocab_size, use_bias=False, rngs=rngs)

  def __call__(self, inputs: jax.Array) -> jax.Array:
    return self.output_layer(self.transformer_blocks(self.embedding_layer(inputs)))


# ------------------------------------------------------------------ cases


@dataclasses.dataclass(frozen=True)
class Case:
  """One model at one size, ready for ``jaxremat.apply`` (linen) or ``apply_nnx`` (nnx).

  Attributes:
    name: the family's name.
    make: ``make(remat)`` builds the model (``remat=True``: every block rematerialised
      the framework's way, same variables).
    batch: the example input.
    kwargs: keyword arguments of every call (linen: ``train=``, ``rngs=``, ``mutable=``).
    blocks: the names jaxremat should give the blocks' layers, in order.
    nnx: the model is a flax.nnx module.
  """

  name: str
  make: Callable[[bool], Any]
  batch: jax.Array
  kwargs: dict[str, Any]
  blocks: tuple[str, ...]
  nnx: bool = False


#: Per size: batch, model width, blocks (per ResNet stage: ``stages``; in the scan:
#: ``scan_depth``, as a scan of 2 is left whole by ``_scan.choose_segment``), sequence
#: length, image side (twice that for the ResNet), vocabulary, and whether the lm1b-like
#: model runs its dropout (a test size leaves it out: its random bits double the compile
#: time).
SIZES: dict[str, dict[str, Any]] = {
    "test": {"batch": 4, "dim": 32, "depth": 2, "scan_depth": 4, "stages": (2, 2), "seq": 16,
             "image": 16, "vocab": 64, "lm_dropout": False},
    "bench": {"batch": 16, "dim": 128, "depth": 8, "scan_depth": 8, "stages": (2, 2, 2, 2),
              "seq": 64, "image": 32, "vocab": 512, "lm_dropout": True},
}

NAMES = ("vit", "lm1b", "wmt", "resnet", "unet", "scan-lm", "minigpt-sequential", "minigpt-list")


def build(name: str, size: str = "test") -> Case:
  """The ``Case`` of family ``name`` (one of ``NAMES``) at ``size`` (a key of ``SIZES``)."""
  s = SIZES[size]
  b, d, depth, seq, vocab = s["batch"], s["dim"], s["depth"], s["seq"], s["vocab"]
  key = jax.random.key(0)
  tokens = jax.random.randint(key, (b, seq), 0, vocab).at[:, -2:].set(0)  # some padding
  dropout = {"rngs": {"dropout": jax.random.key(1, impl="rbg")}}  # compiles faster than threefry
  if name == "vit":
    image = jax.random.normal(key, (b, s["image"], s["image"], 3))
    return Case(name, lambda remat: VisionTransformer(
        10, 4, d, depth, 4, 4 * d, remat=remat), image, {"train": True, **dropout},
        tuple(f"Transformer/encoderblock_{i}" for i in range(depth)))
  if name == "lm1b":
    lm_dropout = s["lm_dropout"]
    return Case(name, lambda remat: TransformerLM(
        vocab, d, depth, 4, 4 * d, seq, deterministic=not lm_dropout, remat=remat),
        tokens, dropout if lm_dropout else {},
        tuple(f"decoder/encoderdecoderblock_{i}" for i in range(depth)))
  if name == "wmt":
    targets = jax.random.randint(jax.random.key(2), (b, seq), 0, vocab).at[:, -3:].set(0)
    return Case(name, lambda remat: Seq2Seq(
        vocab, d, depth, 4, 4 * d, seq, deterministic=not s["lm_dropout"], remat=remat),
        tokens, {"targets": targets, **(dropout if s["lm_dropout"] else {})},
        tuple(f"decoder/blocks_{i}" for i in range(depth)))
  if name == "resnet":
    image = jax.random.normal(key, (b, 2 * s["image"], 2 * s["image"], 3))
    stages = s["stages"]
    return Case(name, lambda remat: ResNet(stages, d // 4, remat=remat), image,
                {"mutable": ["batch_stats"]},
                tuple(f"layer{i + 1}/ResNetBlock_{j}" for i, n in enumerate(stages)
                      for j in range(n)))
  if name == "unet":
    widths = (d // 2, d)
    image = jax.random.normal(key, (b, s["image"], s["image"], 3))
    blocks = ("encoder/down0_block0", "encoder/down0_block1", "encoder/down0_pool",
              "encoder/down1_block0", "encoder/down1_block1", "middle",
              "decoder/(concatenate)", "decoder/up0_block0", "decoder/up0_block1",
              "decoder/(_resize)", "decoder/up0_up",
              "decoder/(concatenate)#2", "decoder/up1_block0", "decoder/up1_block1")
    return Case(name, lambda remat: UNet(widths, remat=remat), image, {}, blocks)
  if name == "scan-lm":
    return Case(name, lambda remat: ScannedLM(vocab, d, s["scan_depth"], 4, 4 * d, remat=remat),
                tokens,
                {}, ("decoder/layers",))
  if name.startswith("minigpt"):
    container = name.split("-")[1]

    def make(remat: bool) -> MiniGPT:
      rngs = nnx.Rngs(jax.random.key(0, impl="rbg"), dropout=jax.random.key(1, impl="rbg"))
      return MiniGPT(seq, vocab, d, 4, 4 * d, depth, rngs=rngs, container=container,
                     remat=remat)

    inner = "layers" if container == "sequential" else "blocks"
    return Case(name, make, tokens, {},
                tuple(f"transformer_blocks/{inner}.{i}" for i in range(depth)), nnx=True)
  raise ValueError(f"unknown model {name!r}; expected one of {NAMES}.")


def init(case: Case, remat: bool = False) -> tuple[Any, Any]:
  """The model and its variables (linen) or the model itself twice (nnx)."""
  model = case.make(remat)
  if case.nnx:
    return model, model
  rngs = {"params": jax.random.key(0, impl="rbg"), **case.kwargs.get("rngs", {})}
  kwargs = {k: v for k, v in case.kwargs.items() if k not in ("rngs", "mutable")}
  return model, jax.jit(functools.partial(model.init, **kwargs))(rngs, case.batch)


def apply(case: Case, model: Any, variables: Any, **options: Any) -> Any:
  """``jaxremat.apply`` (linen, with the case's call kwargs) or ``apply_nnx`` of the model."""
  if case.nnx:
    return jaxremat.apply_nnx(model, case.batch, **options)
  return jaxremat.apply(model.apply, variables, case.batch, **case.kwargs, **options)


def plain_call(case: Case, model: Any) -> Callable[..., Any]:
  """The model's own call in the form of ``Remat.fn``."""
  return (lambda m, x: m(x)) if case.nnx else model.apply


def loss(case: Case, fn: Callable[..., Any]) -> Callable[[Any, Any], jax.Array]:
  """A linen model's loss ``loss(variables, batch)``: a mean square of its prediction."""
  def mean_square(variables: Any, x: jax.Array) -> jax.Array:
    out = fn(variables, x, **case.kwargs)
    return jnp.mean(jnp.square(out[0] if "mutable" in case.kwargs else out))
  return mean_square


def footprint(case: Case, fn: Callable[..., Any], model: Any, variables: Any) -> int:
  """XLA's footprint of the gradient step of ``fn`` (bytes): ``jaxremat.measure`` of the
  loss; for nnx, of ``nnx.grad`` of the loss on the merged model (nnx.remat and Dropout's
  rng counts fail under ``jax.grad`` of a merged model: TraceContextError)."""
  if not case.nnx:
    return jaxremat.measure(loss(case, fn), variables, case.batch).total_bytes
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)

  def step(params: Any, rest: Any, x: jax.Array) -> Any:
    mean_square = lambda m: jnp.mean(jnp.square(fn(m, x)))
    return nnx.grad(mean_square)(nnx.merge(graphdef, params, rest))
  return jaxremat.compile_footprint(step, params, rest, case.batch).total_bytes
