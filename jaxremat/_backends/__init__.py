"""What XLA keeps, per backend: profiles, estimates and compiles."""
