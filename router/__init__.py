"""The router: OpenAI-compatible HTTP and gRPC text APIs in front of workers.

It tokenizes, picks a worker by prefix affinity balanced against load, sends
token ids over gRPC and turns the token streams back into text. All state it
shares with other routers lives in Redis (or, under `pagoda serve` without
Redis, in an in-process store), so any number of routers can run side by side.
"""

from shared.grpc_transport import prefer_legacy_tcp

prefer_legacy_tcp()  # before anything here imports grpc (shared/grpc_transport.py)
