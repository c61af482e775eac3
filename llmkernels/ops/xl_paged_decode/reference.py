"""fp32 reference for Transformer-XL relative-position paged decode (gathers the paged cache)."""
import torch


def cache_as_nhd(k_cache: torch.Tensor, v_cache: torch.Tensor):
    """Views of either cache layout as [num_blocks, block_size, Hkv, D] (no copy)."""
    if k_cache.dim() == 5:  # vLLM legacy: k [nb, Hkv, D/x, bs, x], v [nb, Hkv, D, bs]
        nb, hkv, dx, bs, x = k_cache.shape
        k = k_cache.permute(0, 3, 1, 2, 4).reshape(nb, bs, hkv, dx * x)
        return k, v_cache.permute(0, 3, 1, 2)
    return k_cache, v_cache


def attended(block_tables, context_lens, num_blocks: int, block_size: int, max_len: int):
    """(block id [S, max_len] clamped in range, attended mask [S, max_len]) for every cache slot.

    A token is attended when j < clamp(context_len, 0, max_len) and its block id is in [0, num_blocks);
    tokens of out-of-range blocks are skipped (the kernel's documented behaviour).
    """
    t = torch.arange(max_len, device=block_tables.device)
    lens = context_lens.long().clamp(0, max_len)
    blk = block_tables.long()[:, t // block_size]
    ok = (t[None, :] < lens[:, None]) & (blk >= 0) & (blk < num_blocks)
    return torch.where(ok, blk, torch.zeros_like(blk)), ok


def xl_paged_decode_ref(q, k_cache, v_cache, block_tables, context_lens, u=None, bd=None, scale=None):
    """fp32 reference. Returns (out [S, H, D] fp32, lse [S, H] fp32, natural log).

    logit_j = scale * ((q + u) . k_j + bd[s, h, j]) over attended tokens j (see `attended`); context
    lengths are clamped to [0, max_blocks * block_size] and to bd's last dim when bd is given. A row
    with no attended token gets out 0 and lse -inf; a NaN in an attended token's inputs makes its row NaN.
    """
    S, H, D = q.shape
    k, v = cache_as_nhd(k_cache, v_cache)
    nb, bs, hkv = k.shape[0], k.shape[1], k.shape[2]
    G = H // hkv
    scale = D ** -0.5 if scale is None else scale
    max_len = block_tables.shape[1] * bs
    if bd is not None:
        max_len = min(max_len, bd.shape[-1])
    blk, ok = attended(block_tables, context_lens, nb, bs, max_len)
    off = (torch.arange(max_len, device=q.device) % bs)[None, :].expand_as(blk)
    kg = k[blk, off].float()  # [S, L, Hkv, D]
    vg = v[blk, off].float().masked_fill(~ok[:, :, None, None], 0.0)  # unattended slots are never read
    qf = q.float() if u is None else q.float() + u.float()
    logits = torch.einsum("skgd,slkd->skgl", qf.reshape(S, hkv, G, D), kg).reshape(S, H, max_len)
    if bd is not None:
        logits = logits + bd[:, :, :max_len].float()
    logits = (logits * scale).masked_fill(~ok[:, None, :], float("-inf"))
    lse = torch.logsumexp(logits, dim=-1)  # -inf where nothing is attended
    p = torch.exp(logits - torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)[..., None])
    out = torch.einsum("skgl,slkd->skgd", p.reshape(S, hkv, G, max_len), vg).reshape(S, H, D)
    return out, lse
