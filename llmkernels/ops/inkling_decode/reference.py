"""fp32 reference of inkling_decode (either cache layout)."""
import torch

from ..xl_paged_decode.reference import attend, gather_cache


def band_bias(rel_bias: torch.Tensor, lengths: torch.Tensor, L: int) -> torch.Tensor:
    """[S, H, L] fp32: rel_bias[s, h, (len_s - 1) - t] where that distance is in [0, E), else 0."""
    S, H, E = rel_bias.shape
    dist = (lengths.long()[:, None] - 1) - torch.arange(L, device=rel_bias.device)[None, :]
    band = (dist >= 0) & (dist < E)
    b = rel_bias.float().gather(-1, dist.clamp(0, E - 1)[:, None, :].expand(S, H, L))
    return b.masked_fill(~band[:, None, :], 0.0)


def inkling_decode_ref(q, k, v, rel_bias, lengths, block_tables=None, window=None, starts=None, scale=None):
    """fp32 reference. Returns (out [S, H, D], lse [S, H]).

    The query of sequence s sits at position len_s - 1 (len_s = lengths[s] clamped to the cache's length);
    logit_t = scale * q . k_t + rel_bias[s, h, len_s - 1 - t] (0 past the band's E) over keys t in [lo_s, len_s),
    lo_s = max(starts[s], len_s - window). A row with no key gets out 0 and lse -inf.
    """
    S, H, D = q.shape
    scale = D ** -0.5 if scale is None else scale
    if block_tables is None:  # [S, Hkv, L, D]
        L = k.shape[2]
        lens = lengths.long().clamp(0, L)
        ok = torch.arange(L, device=q.device)[None, :] < lens[:, None]
        kg, vg = k.transpose(1, 2).float(), v.transpose(1, 2).float()
    else:
        bs = k.shape[3] if k.dim() == 5 else k.shape[1]
        L = block_tables.shape[1] * bs
        lens = lengths.long().clamp(0, L)
        kg, vg, ok = gather_cache(k, v, block_tables, lengths, L)
    lo = torch.zeros_like(lens)
    if starts is not None:
        lo = torch.minimum(starts.long().clamp(min=0), lens)
    if window is not None:
        lo = torch.maximum(lo, lens - window)
    ok = ok & (torch.arange(L, device=q.device)[None, :] >= lo[:, None])
    vg = vg.masked_fill(~ok[:, :, None, None], 0.0)  # keys not attended are never read
    bias = band_bias(rel_bias, lens, L)
    return attend(q.float(), kg, vg, ok, lambda x: x * scale + bias)
