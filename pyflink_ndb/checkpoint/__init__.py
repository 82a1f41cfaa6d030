"""The checkpoint protocol: epochs, commit markers, roll-back on restore, garbage collection."""
