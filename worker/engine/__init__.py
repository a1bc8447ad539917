"""The engine: requests in, token streams out, one step at a time."""
