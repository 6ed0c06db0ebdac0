"""The memory models, free of JAX: chains, graphs, their peaks and the event simulator."""
