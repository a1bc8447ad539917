"""Each sharded layer at tensor-parallel size 2 (two gloo ranks) against its dense twin.

Weights load through the layers' own weight_loader hooks, both from whole
tensors and from safetensors slices (each rank reads only its part).
"""

from __future__ import annotations

import socket

import torch
import torch.multiprocessing as mp
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file

from worker import distributed
from worker.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from worker.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from worker.models.checkpoint_slice import CheckpointSlice

WORLD = 2
TOL = dict(rtol=1e-5, atol=1e-6)


def _dense(shape, seed):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def _load(layer, name, tensor, shard_id=None):
    param = getattr(layer, name)
    param.weight_loader(param, tensor, shard_id)


def _check_column(rank, slices):
    w, b, x = _dense((12, 8), 1), _dense(12, 2), _dense((5, 8), 3)
    layer = ColumnParallelLinear(8, 12, bias=True)
    _load(layer, "weight", slices["col.weight"])
    _load(layer, "bias", b)
    assert layer.weight.shape == (6, 8)
    torch.testing.assert_close(layer(x), F.linear(x, w, b)[:, rank * 6 : (rank + 1) * 6], **TOL)


def _check_row(rank, slices):
    w, b, x = _dense((8, 12), 4), _dense(8, 5), _dense((5, 12), 6)
    layer = RowParallelLinear(12, 8, bias=True)
    _load(layer, "weight", slices["row.weight"])
    _load(layer, "bias", b)
    assert layer.weight.shape == (8, 6)
    # Each rank feeds its slice of the input; the all-reduce sums the partial outputs.
    out = layer(x[:, rank * 6 : (rank + 1) * 6].contiguous())
    torch.testing.assert_close(out, F.linear(x, w, b), **TOL)


def _check_merged(rank):
    gate, up, x = _dense((10, 8), 7), _dense((10, 8), 8), _dense((3, 8), 9)
    layer = MergedColumnParallelLinear(8, [10, 10])
    _load(layer, "weight", gate, 0)
    _load(layer, "weight", up, 1)
    half = slice(rank * 5, (rank + 1) * 5)
    want = torch.cat([F.linear(x, gate)[:, half], F.linear(x, up)[:, half]], dim=-1)
    torch.testing.assert_close(layer(x), want, **TOL)


def _check_qkv(rank, num_kv_heads):
    head_dim, hidden = 4, 16
    q = _dense((4 * head_dim, hidden), 10)
    k = _dense((num_kv_heads * head_dim, hidden), 11)
    v = _dense((num_kv_heads * head_dim, hidden), 12)
    x = _dense((3, hidden), 13)
    layer = QKVParallelLinear(hidden, head_dim, 4, num_kv_heads, bias=False)
    for shard_id, tensor in (("q", q), ("k", k), ("v", v)):
        _load(layer, "weight", tensor, shard_id)
    # Two query heads per rank; KV heads split, or the one KV head on both ranks.
    kv_head = rank if num_kv_heads == 2 else 0
    assert (layer.num_heads, layer.num_kv_heads) == (2, 1)
    q_out, k_out, v_out = layer(x).split([8, 4, 4], dim=-1)
    kv_rows = slice(kv_head * head_dim, (kv_head + 1) * head_dim)
    torch.testing.assert_close(q_out, F.linear(x, q)[:, rank * 8 : (rank + 1) * 8], **TOL)
    torch.testing.assert_close(k_out, F.linear(x, k)[:, kv_rows], **TOL)
    torch.testing.assert_close(v_out, F.linear(x, v)[:, kv_rows], **TOL)


def _check_vocab(slices):
    # 11 rows do not split in two: the last rank's slice is padded.
    table, ids, hidden = _dense((11, 6), 14), torch.tensor([0, 5, 6, 10, 3]), _dense((2, 6), 15)
    embed = VocabParallelEmbedding(11, 6)
    _load(embed, "weight", slices["embed.weight"])
    assert embed.weight.shape == (6, 6)
    torch.testing.assert_close(embed(ids), F.embedding(ids, table), rtol=0, atol=0)
    head = ParallelLMHead(11, 6)
    _load(head, "weight", table)
    torch.testing.assert_close(head.compute_logits(hidden), F.linear(hidden, table), **TOL)


def _run_rank(rank: int, port: int, path: str) -> None:
    distributed.init_tensor_parallel(rank, WORLD, f"tcp://127.0.0.1:{port}", "gloo")
    try:
        with safe_open(path, framework="pt") as f:
            slices = {name: CheckpointSlice(f, name) for name in f.keys()}  # noqa: SIM118
            _check_column(rank, slices)
            _check_row(rank, slices)
            _check_vocab(slices)
        _check_merged(rank)
        _check_qkv(rank, num_kv_heads=2)
        _check_qkv(rank, num_kv_heads=1)
    finally:
        distributed.destroy_tensor_parallel()


def test_sharded_layers_match_their_dense_twins(tmp_path):
    path = tmp_path / "weights.safetensors"
    save_file(
        {
            "col.weight": _dense((12, 8), 1),
            "row.weight": _dense((8, 12), 4),
            "embed.weight": _dense((11, 6), 14),
        },
        str(path),
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_run_rank, args=(port, str(path)), nprocs=WORLD, join=True)


def test_a_checkpoint_slice_reads_only_the_rows_asked_for(tmp_path):
    path = tmp_path / "w.safetensors"
    full = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    save_file({"w": full}, str(path))
    with safe_open(str(path), framework="pt") as f:
        part = CheckpointSlice(f, "w")
        assert part.shape == (4, 6)
        assert part.narrow(1, 2, 3).tolist() == full[:, 2:5].tolist()
        assert part.narrow(0, 3, 1).tolist() == [[18.0, 19.0, 20.0, 21.0, 22.0, 23.0]]
