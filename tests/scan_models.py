"""A scanned stack of residual MLP blocks, as ``nn.scan`` over stacked parameters writes it."""

import flax.linen as nn


class _Block(nn.Module):
  hidden: int

  @nn.compact
  def __call__(self, x, _):
    h = nn.gelu(nn.Dense(self.hidden)(nn.LayerNorm()(x)))
    return x + nn.Dense(x.shape[-1])(h), None


class ScannedMLP(nn.Module):
  """Dense to ``width`` -> ``depth`` blocks ``x + Dense(gelu(Dense(hidden)(LN(x))))`` as
  one ``nn.scan`` named ``layers`` -> Dense to ``outputs``."""

  width: int
  hidden: int
  outputs: int
  depth: int = 8

  @nn.compact
  def __call__(self, x):
    stack = nn.scan(_Block, variable_axes={"params": 0}, split_rngs={"params": True},
                    length=self.depth)
    x, _ = stack(self.hidden, name="layers")(nn.Dense(self.width)(x), None)
    return nn.Dense(self.outputs)(x)
