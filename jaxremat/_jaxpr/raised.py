"""Notes for an error the model raised while jaxremat traced it: how it was called, and
what the error most likely asks for (an rng stream, a mutable collection, integer inputs,
an input passed by keyword, an option of jaxremat's given to the model)."""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax

#: How the note apply adds to an error the model raised while traced begins.
RAISED_NOTE = "jaxremat: the model raised this when traced as "


def tree_shapes(tree: Any) -> str:
  """A pytree of arrays as its structure with each leaf's dtype and shape, at most 200
  characters (e.g. ``{'logits': 'float32[32, 10]'}``)."""
  shapes = str(jax.tree_util.tree_map(lambda x: f"{x.dtype}{list(x.shape)}", tree))
  return shapes[:200] + "..." if len(shapes) > 200 else shapes


def flax_missing(err: BaseException) -> tuple[str, str] | None:
  """Of flax's two errors of a call missing a keyword argument, which and for what:
  ``("rngs", stream)`` (a Dropout's ``InvalidRngError``), ``("mutable", collection)`` (a
  BatchNorm's ``ModifyScopeVariableError``); else None."""
  kind = {"InvalidRngError": ("rngs", r'PRNG for "([^"]+)"', "dropout"),
          "ModifyScopeVariableError": ("mutable", r'collection "([^"]+)"', "batch_stats")}
  if type(err).__name__ not in kind:
    return None
  keyword, pattern, default = kind[type(err).__name__]
  found = re.search(pattern, str(err))
  return keyword, found.group(1) if found else default


def flax_hint(err: BaseException) -> str:
  """What to pass for ``flax_missing``'s errors, in words; else ``""``."""
  missing = flax_missing(err)
  if missing is None:
    return ""
  keyword, name = missing
  if keyword == "rngs":
    return (f"The model needs the rng stream {name!r}: pass rngs={{{name!r}: "
            "jax.random.key(0)} to jaxremat as to model.apply.")
  return (f"The model updates the collection {name!r} (BatchNorm's statistics in "
          f"training): pass mutable=[{name!r}] to jaxremat as to model.apply.")


def asks_for_integers(err: BaseException) -> bool:
  """Whether ``err`` is ``nn.Embed``'s (or ``nnx.Embed``'s) refusal of non-integer inputs."""
  return "must be an integer" in str(err)


def integer_hint(err: BaseException, batch: Any) -> str:
  """What to pass when the model asked for integer inputs (``nn.Embed``'s token ids) and
  the batch holds floats, in words; else ``""``."""
  floats = any(jax.numpy.issubdtype(x.dtype, jax.numpy.floating)
               for x in jax.tree_util.tree_leaves(batch))
  if not (floats and asks_for_integers(err)):
    return ""
  return ("The model asks for integers (token ids, as nn.Embed does) and the batch holds "
          "floats: pass integer inputs (batch.astype(jnp.int32); on the command line, "
          "--dtype int32).")


def missing_inputs(err: BaseException, callee: str | None) -> list[str]:
  """The positional parameters a ``TypeError`` says ``callee`` (a qualified name, e.g.
  ``"Denoiser.__call__"``) was called without: the model takes more inputs than the
  batch (a diffusion model's timestep); else ``[]`` (another function's call failed)."""
  first = (str(err).splitlines() or [""])[0]
  found = re.match(r"(\S+)\(\) missing \d+ required positional arguments?: (.*)$", first)
  if not isinstance(err, TypeError) or found is None or found.group(1) != callee:
    return []
  return re.findall(r"'([^']+)'", found.group(2))


def model_callee(model_fn: Callable[..., Any]) -> str | None:
  """The qualified name Python's errors give the model's own call: a Flax module's
  ``__call__`` for ``model.apply``, else ``model_fn``'s."""
  owner = getattr(model_fn, "__self__", None)
  call = getattr(type(owner), "__call__", None) if owner is not None else model_fn
  return getattr(call, "__qualname__", None)


def inputs_hint(err: BaseException, model_fn: Callable[..., Any]) -> str:
  """What to pass when the model takes more positional inputs than the batch, in words;
  else ``""``."""
  names = missing_inputs(err, model_callee(model_fn))
  if not names:
    return ""
  given = ", ".join(f"{n}={n}" for n in names)
  return (f"The model takes more inputs than the batch ({', '.join(map(repr, names))}): "
          f"pass them by keyword, jaxremat.apply(model.apply, params, batch, {given}), "
          "as model.apply takes them; arrays given so are inputs of the step, as the batch "
          "is.")


def model_raised_note(params: Any, batch: Any, nnx: bool, hint: str = "") -> str:
  """What jaxremat called when the model raised: the params' top-level keys, the batch's
  shapes and dtypes, and how ``model_fn`` is called (an nnx module: ``model(batch)``)."""
  keys = list(params) if isinstance(params, Mapping) else type(params).__name__
  shapes = tree_shapes(batch)
  if nnx:
    return (f"{RAISED_NOTE}model(batch), batch {shapes}: " + (hint or "batch is the "
            "module's one positional input, batch axis first (a tuple is passed whole); labels "
            "for the loss go in loss_fn=, closed over."))
  return (f"{RAISED_NOTE}model_fn(params, batch, **model_kwargs), params with top-level "
          f"keys {keys}, batch {shapes}. " + (hint or "model_fn is called as flax's "
          "model.apply is: params is the whole variables dict ({'params': ...}, with "
          "'batch_stats' where the model has them), batch the model's one positional input, "
          "batch axis first (a tuple is passed whole); labels for the loss go in loss_fn=, "
          "closed over."))


def option_note(message: str, model_kwargs: Mapping[str, Any], caller: str,
                options: Sequence[str]) -> str | None:
  """Where the model refused a keyword it was given (``message``: its ``TypeError``) that
  is near one of ``options`` (``caller``'s, e.g. ``budget=`` for ``budget_bytes=``) or is
  ``wrt=``, the note that says so; else None."""
  found = re.search(r"unexpected keyword argument '(\w+)'", message)
  if not found or found.group(1) not in model_kwargs:
    return None
  name = found.group(1)
  if name == "wrt":
    return (f"jaxremat: wrt= is apply_nnx's and fit_nnx's option, so {caller} passed it to "
            "the model. With model_fn, params is what the training step differentiates: "
            "pass parameters that are not trained (a LoRA model's frozen base) as a keyword "
            "array instead (docs/usage.md, 'Training part of the parameters').")
  close = difflib.get_close_matches(name, options, n=1, cutoff=0.6)
  if not close:
    return None
  return (f"jaxremat: {name}= is not an option of {caller}, so it was passed to the model "
          f"as one of its own keyword arguments: did you mean {close[0]}=?")
