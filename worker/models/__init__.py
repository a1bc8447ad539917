"""Model architectures, their checkpoint specs and weight loading."""
