"""The public entry points: apply, its result, verification and the drop-in."""
