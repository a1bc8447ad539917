"""Which rounding does the Triton rotary kernel on a GPU match? (rotary_diag.txt)"""

import torch

from kernels.triton.elementwise import rotary_embedding
from worker.layers.rotary import RopeSpec, RotaryEmbedding

gen = torch.Generator().manual_seed(2)
for dt in (torch.bfloat16, torch.float16):
    emb = RotaryEmbedding(64, 256, RopeSpec(), dt)
    qkv = torch.randn(4, 5 * 64, generator=gen).to(dt)
    positions = torch.tensor([200, 0, 17, 63])
    q = qkv[:, :192]
    cos, sin = emb._lookup(positions)
    want = emb._rotate(q, cos, sin)
    d = qkv.cuda()
    rotary_embedding(
        d[:, :192], d[:, 192:256], positions.cuda(), emb.cos_cache.cuda(), emb.sin_cache.cuda(), 64
    )
    got = d[:, :192].cpu()
    x = q.reshape(4, 3, 64)
    x1, x2 = x[..., :32].float(), x[..., 32:].float()
    c, s = cos.float(), sin.float()

    def r(t, dt=dt):
        return t.to(dt).float()

    variants = {
        "twin-emulated": torch.cat(
            ((r(x1 * c) - r(x2 * s)).to(dt), (r(x2 * c) + r(x1 * s)).to(dt)), -1
        ),
        "no-inner-round": torch.cat(((x1 * c - x2 * s).to(dt), (x2 * c + x1 * s).to(dt)), -1),
        "fma-first": torch.cat(((x1 * c - r(x2 * s)).to(dt), (x2 * c + r(x1 * s)).to(dt)), -1),
        "fma-second": torch.cat(((r(x1 * c) - x2 * s).to(dt), (r(x2 * c) + x1 * s).to(dt)), -1),
    }
    print(
        dt,
        "got==want",
        torch.equal(got, want),
        "mismatches",
        int((got != want).sum()),
        "of",
        got.numel(),
    )
    for name, v in variants.items():
        v = v.reshape(4, -1)
        print(
            "  ",
            name,
            "equals got:",
            torch.equal(v, got),
            "mismatches vs got",
            int((v != got).sum()),
        )
    idx = (got != want).nonzero()[:5]
    for i, j in idx.tolist():
        print("   at", i, j, "got", got[i, j].item(), "want", want[i, j].item())
    k_want = emb._rotate(qkv[:, 192:256], cos, sin)
    print(
        "  k equal",
        torch.equal(d[:, 192:256].cpu(), k_want),
        "v untouched",
        torch.equal(d[:, 256:].cpu(), qkv[:, 256:]),
    )
