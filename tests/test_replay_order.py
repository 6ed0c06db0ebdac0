"""The compiled profile's virtual schedule, on hand-made replays (no compile)."""

import dataclasses

from jaxremat._backends.replay import Replay, Value, chain_kept


def _replay() -> Replay:
  """Three layers, one step each in the forward (steps 0-2); the backward (steps 3-6)
  runs layer 2, layer 1's input gradient, layer 0 (with a 1,000-byte workspace), and
  last layer 1's weight gradient, which XLA put off in the plain step. Layer 0's output
  (100 bytes) is read by layer 1 in the forward and by that weight gradient."""
  return Replay(
      values=(Value(0, 6, 100, True, 1), Value(5, 5, 1000, True, None)),
      turn=3, forward_layer=(0, 1, 2), backward_layer=(2, 1, 0, 1),
      kept=chain_kept((0, 100, 10, 0)), layers=3, fixed_bytes=7)


def test_a_recomputed_segment_runs_each_layer_backward_whole():
  # Plan (2,): layers 0-1 are recomputed. Their backward runs layer 1's steps, its weight
  # gradient included, before layer 0's, so layer 0's recomputed output is freed before
  # the workspace is made (1,100 bytes at once in the plain step's order).
  r = _replay()
  assert r.live_bytes((2,)) == 1000
  assert r.total_bytes((2,)) == 7 + 1000


def test_the_last_segment_keeps_the_plain_steps_order():
  # Without remat the plain step is replayed as XLA scheduled it: the output is live
  # from step 0 to the put-off weight gradient, over the workspace.
  r = _replay()
  assert r.live_bytes(()) == 1100
  assert r.total_bytes(()) == 7 + 1024 + 100  # the workspace placed first, the output above


def test_a_value_that_ends_before_a_gradient_is_written_goes_into_its_buffer():
  # A 1,000-byte gradient written at step 6 (layer 1's put-off weight gradient). The
  # plain step's workspace (step 5) ends before it: XLA's buffer assigner puts it there.
  # Under plan (2,) that gradient is written (with layer 1's backward) before layer 0's
  # workspace: the workspace is temp again.
  r = dataclasses.replace(_replay(), grads=((1000, 6),))
  assert r.intervals(()) == [(0, 6, 100)]
  assert r.total_bytes(()) == 7 + 100
  assert r.total_bytes((2,)) == 7 + 1000


def test_a_value_xla_put_in_an_output_buffer_stays_there_and_keeps_it_busy():
  # XLA put the workspace (step 5) in the gradient's buffer: it costs no temp bytes. A
  # 100-byte value read last at step 5 would fit there before step 6, but the workspace
  # holds the buffer at step 5; alone, it goes in.
  act = Value(0, 5, 100, True, 1)
  r = dataclasses.replace(_replay(), values=(act, Value(5, 5, 1000, True, None, 0)),
                          grads=((1000, 6),))
  assert r.intervals(()) == [(0, 5, 100)]
  assert r.total_bytes(()) == 7 + 100
  assert dataclasses.replace(r, values=(act,)).intervals(()) == []


def test_a_value_xla_put_in_an_output_buffer_costs_no_temp_bytes_under_any_plan():
  # Under plan (2,) layer 1's put-off gradient (step 6) is written before layer 0's
  # backward (step 5), past the workspace XLA put in that buffer. It still costs no temp
  # bytes: XLA makes such values (zero broadcasts) again under remat where needed.
  r = dataclasses.replace(_replay(), values=(Value(5, 5, 1000, True, None, 0),),
                          grads=((1000, 6),))
  assert r.intervals(()) == []
  assert r.intervals((2,)) == []  # (the 10-byte checkpoint fits in the gradient's buffer)


def test_a_value_the_batch_does_not_feed_is_made_where_a_recomputed_segment_reads_it():
  # Layer 0 runs forward steps 0-1, layers 1 and 2 steps 2 and 3; the backward runs
  # layers 2, 1, 0 (steps 4-6). Random bits layer 0 makes at step 0 from the key, reads
  # at step 1 and in its backward (step 6): in the plain step they live from step 0; in
  # the recomputed segment of plan (2,) XLA makes them where layer 0 first reads them.
  bits = Value(0, 6, 500, True, 1, first_read=1)
  r = Replay(values=(bits,), turn=4, forward_layer=(0, 0, 1, 2), backward_layer=(2, 1, 0),
             kept=chain_kept((0, 100, 10, 0)), layers=3, fixed_bytes=7)
  plain = dataclasses.replace(r, values=(dataclasses.replace(bits, first_read=None),))
  assert r.intervals(()) == plain.intervals(()) == [(0, 6, 500)]
  # the forward piece, then the recompute's (plan (2,): layers 0-1 recomputed at 5-7)
  assert [(a, b) for a, b, size in r.intervals((2,)) if size == 500] == [(1, 1), (6, 9)]
  assert [(a, b) for a, b, size in plain.intervals((2,)) if size == 500] == [(0, 1), (5, 9)]
  # a value made by another layer than the one that reads it (a weight's transpose) stays
  other = dataclasses.replace(r, values=(Value(0, 6, 500, True, 2, first_read=2),))
  assert [(a, b) for a, b, size in other.intervals((2,)) if size == 500][0][0] == 0


def test_a_value_made_once_lives_on_to_where_a_recomputed_segment_reads_it_again():
  # A constant (300 bytes, no layer makes it) read by layer 0's forward step. Under plan
  # (2,) layers 0-1 are recomputed (steps 4-5) and layer 1 needs layer 0's output: the
  # recompute reads the one constant again. Under (1,) layer 0 ends its segment: the
  # backward needs its input only, so its step does not run again.
  zeros = Value(0, 0, 300, False, None, forward_reads=(0,))
  r = dataclasses.replace(_replay(), values=(zeros,))
  assert r.intervals(()) == [(0, 0, 300)]
  assert [(a, b) for a, b, size in r.intervals((2,)) if size == 300] == [(0, 4)]
  assert [(a, b) for a, b, size in r.intervals((1,)) if size == 300] == [(0, 0)]


def _four_layers(*values: Value) -> Replay:
  """Four layers, one step each: the forward (steps 0-3), the backward (steps 4-7) from
  layer 3 down; each cut keeps 100 bytes (a chain)."""
  return Replay(values=values, turn=4, forward_layer=(0, 1, 2, 3), backward_layer=(3, 2, 1, 0),
                kept=chain_kept((0, 100, 100, 100, 0)), layers=4, fixed_bytes=0)


def test_a_cotangent_wider_than_the_cut_ends_where_the_recompute_starts():
  # Layer 2's backward (step 5) makes 200 bytes that layer 1's backward (step 6) reads:
  # more than the 100 bytes cut 2 keeps of layer 2 (an f32 cotangent of a bf16 output, a
  # concatenation's). Under plan (2,) XLA hands the recomputed segment (layers 0-1) the
  # cut's 100-byte cotangent, summed before the recompute: the 200 bytes end just before
  # it (virtual steps 6-7), the 100 live from there to layer 1's backward (step 8).
  # (The checkpoint x_2 itself: 100 bytes from layer 1's forward to layer 2's backward.)
  r = _four_layers(Value(5, 6, 200, True, None))
  assert sorted(r.intervals((2,))) == [(1, 5, 100), (5, 5, 200), (6, 8, 100)]
  # Plan (1, 2, 3): layer 1's segment is recomputed at virtual step 7, after layer 2's
  # recompute (5) and backward (6); the checkpoints x_1, x_2, x_3 as before.
  assert sorted(r.intervals((1, 2, 3))) == [(0, 8, 100), (1, 6, 100), (2, 4, 100),
                                            (6, 6, 200), (7, 8, 100)]
  # No wider than the cut: over its steps, across the recompute.
  r = _four_layers(Value(5, 6, 100, True, None))
  assert sorted(r.intervals((2,))) == [(1, 5, 100), (5, 8, 100)]


def test_a_weights_cast_one_layer_reads_is_made_again_in_its_recompute():
  # A cast of a weight (50 bytes) that XLA made at the start of the plain step (step 0)
  # for layer 2, read by its forward (step 2) and its backward (step 5). It belongs to
  # layer 2: under plan (3,) it lives at layer 2's forward read (step 2), and again from
  # layer 2's recompute (virtual step 7) to its backward (8); held from step 0 as a value
  # made once, it would span every step. (The checkpoint x_3: steps 2-4.)
  cast = Value(0, 5, 50, True, 2, -1, 2, (), 2)
  assert sorted(_four_layers(cast).intervals((3,))) == [(2, 2, 50), (2, 4, 100), (7, 8, 50)]
