import torch


def masked_decode_ref(q, k, v, drop_mask=None, kv_len=None, sm_scale=None):
    """fp32 reference for masked GQA decode.

    q [B, Hq, D]; k, v [B, Hkv, L, D]; drop_mask [B, Hkv, L] bool, True = token dropped;
    kv_len None | int | int tensor [B] (clamped to [0, L]). Returns (out [B, Hq, D] fp32, lse [B, Hq] fp32).
    A row with nothing kept gets out 0, lse -inf; a NaN in q or a kept K/V row makes the row NaN.
    """
    B, Hq, D = q.shape
    Hkv, L = k.shape[1], k.shape[2]
    G = Hq // Hkv
    scale = D ** -0.5 if sm_scale is None else sm_scale
    qf = q.float().reshape(B, Hkv, G, D)
    s = torch.einsum("bhgd,bhld->bhgl", qf, k.float()) * scale
    keep = torch.ones(B, Hkv, L, dtype=torch.bool, device=q.device)
    if drop_mask is not None:
        keep &= ~drop_mask
    if kv_len is not None:
        lens = torch.as_tensor(kv_len, device=q.device).reshape(-1).expand(B).clamp(0, L)
        keep &= torch.arange(L, device=q.device)[None, None, :] < lens[:, None, None]
    s = s.masked_fill(~keep[:, :, None, :], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # -inf where nothing is kept
    p = torch.exp(s - torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)[..., None])
    out = torch.einsum("bhgl,bhld->bhgd", p, v.float().masked_fill(~keep[..., None], 0.0))  # dropped: never read
    return out.reshape(B, Hq, D), lse.reshape(B, Hq)
