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


def gather_cache(k_cache, v_cache, block_tables, context_lens, max_len: int):
    """(k, v [S, max_len, Hkv, D] fp32, attended [S, max_len]) of a paged cache (see `attended`); unattended V
    slots are 0 (never read)."""
    k, v = cache_as_nhd(k_cache, v_cache)
    blk, ok = attended(block_tables, context_lens, k.shape[0], k.shape[1], max_len)
    off = (torch.arange(max_len, device=k.device) % k.shape[1])[None, :].expand_as(blk)
    return k[blk, off].float(), v[blk, off].float().masked_fill(~ok[:, :, None, None], 0.0), ok


def attend(qf, kg, vg, ok, logits_fn):
    """softmax attention of qf [S, H, D] fp32 over kg / vg [S, L, Hkv, D] (GQA), logits = logits_fn(q.k [S, H, L]),
    keys where ok [S, L]. Returns (out [S, H, D], lse [S, H]); a row with nothing attended gets 0 and -inf."""
    S, H, D = qf.shape
    L, hkv = kg.shape[1], kg.shape[2]
    G = H // hkv
    logits = torch.einsum("skgd,slkd->skgl", qf.reshape(S, hkv, G, D), kg).reshape(S, H, L)
    logits = logits_fn(logits).masked_fill(~ok[:, None, :], float("-inf"))
    lse = torch.logsumexp(logits, dim=-1)  # -inf where nothing is attended
    p = torch.exp(logits - torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)[..., None])
    out = torch.einsum("skgl,slkd->skgd", p.reshape(S, hkv, G, L), vg).reshape(S, H, D)
    return out, lse


def xl_paged_decode_ref(q, k_cache, v_cache, block_tables, context_lens, u=None, bd=None, scale=None):
    """fp32 reference. Returns (out [S, H, D] fp32, lse [S, H] fp32, natural log).

    logit_j = scale * ((q + u) . k_j + bd[s, h, j]) over attended tokens j (see `attended`); context
    lengths are clamped to [0, max_blocks * block_size] and to bd's last dim when bd is given. A row
    with no attended token gets out 0 and lse -inf; a NaN in an attended token's inputs makes its row NaN.
    """
    D = q.shape[2]
    bs = k_cache.shape[3] if k_cache.dim() == 5 else k_cache.shape[1]
    scale = D ** -0.5 if scale is None else scale
    max_len = block_tables.shape[1] * bs
    if bd is not None:
        max_len = min(max_len, bd.shape[-1])
    kg, vg, ok = gather_cache(k_cache, v_cache, block_tables, context_lens, max_len)
    qf = q.float() if u is None else q.float() + u.float()
    return attend(qf, kg, vg, ok, lambda x: (x if bd is None else x + bd[:, :, :max_len].float()) * scale)
