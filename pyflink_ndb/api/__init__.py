"""Public API: put a keyed function on the bridge operator so its state is tiered."""
