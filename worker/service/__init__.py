"""The worker service: the engine behind gRPC, announced in Redis (docs/ARCHITECTURE.md)."""
