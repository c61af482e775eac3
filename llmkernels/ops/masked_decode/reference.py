import torch


def masked_decode_ref(q, k, v, drop_mask=None, kv_len=None, sm_scale=None, kept_idx=None, kept_len=None,
                      dense_from=None):
    """fp32 reference for masked GQA decode.

    q [B, Hq, D]; k, v [B, Hkv, L, D]; drop_mask [B, Hkv, L] bool, True = token dropped;
    kv_len None | int | int tensor [B] (clamped to [0, L]). Returns (out [B, Hq, D] fp32, lse [B, Hq] fp32).
    A row with nothing kept gets out 0, lse -inf; a NaN in q or a kept K/V row makes the row NaN.
    kept_idx / kept_len / dense_from: the kept lists (masked_decode's doc; kept_idx None: each row's first kept_len
    positions); a position weighs as often as it is listed (its logit plus log(count)).
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
    lens = torch.full((B,), L, device=q.device) if kv_len is None else \
        torch.as_tensor(kv_len, device=q.device).reshape(-1).expand(B).clamp(0, L)
    keep &= torch.arange(L, device=q.device)[None, None, :] < lens[:, None, None]
    if kept_len is not None:
        pos = torch.arange(L, device=q.device)
        df = L if dense_from is None else dense_from
        if kept_idx is None:  # a prefix: each row's first kept_len positions
            kept_idx = torch.arange(df, dtype=torch.int32, device=q.device).expand(B, Hkv, df)
        count = (pos >= df).float().expand(B, Hkv, L).clone()
        n = kept_len.long().clamp(0, kept_idx.shape[2])
        for b in range(B):
            for h in range(Hkv):
                p = kept_idx[b, h, :n[b, h]].long()
                p = p[(p >= 0) & (p < min(df, int(lens[b])))]
                count[b, h].index_add_(0, p, torch.ones_like(p, dtype=torch.float32))
        keep &= count > 0
        s = s + count.log()[:, :, None, :]
    s = s.masked_fill(~keep[:, :, None, :], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # -inf where nothing is kept
    p = torch.exp(s - torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)[..., None])
    out = torch.einsum("bhgl,bhld->bhgd", p, v.float().masked_fill(~keep[..., None], 0.0))  # dropped: never read
    return out.reshape(B, Hq, D), lse.reshape(B, Hq)
