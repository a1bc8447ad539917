"""Turning a batch of logits into next tokens, each row with its own parameters."""
