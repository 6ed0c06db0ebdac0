"""Jaxpr work: trace a model into layers, rewrite scans, emit the checkpointed function."""
