"""Generated protobuf and gRPC stubs of `protos/`, importable as `shared.proto.pagoda...`.

The stubs under `shared/proto/pagoda/` are generated, never edited by hand:
`python -m shared.proto.generate` rewrites them from the `.proto` files, and a
test fails when the committed stubs and the protos disagree.
"""
