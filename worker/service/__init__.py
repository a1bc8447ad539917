"""The worker service: the engine behind gRPC, announced in Redis (docs/ARCHITECTURE.md)."""

from shared.grpc_transport import prefer_legacy_tcp

prefer_legacy_tcp()  # before anything here imports grpc (shared/grpc_transport.py)
