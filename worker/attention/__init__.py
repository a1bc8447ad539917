"""Attention metadata, the forward context that carries it, and backends."""
