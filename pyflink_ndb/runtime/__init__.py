"""What runs inside the TaskManager: the per-subtask backend and the entry points the Java
bridge calls."""
