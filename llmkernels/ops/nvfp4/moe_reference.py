"""fp32 reference of nvfp4_moe (plain-layout weights)."""
import torch

from .format import nvfp4_dequantize


def nvfp4_moe_ref(x, top_k_index, top_k_weights, gate, up, down):
    """gate / up / down: (packed [E, N, K/2], scales [E, N, K/16], global scales [E]) in the plain layout. Gate and
    up outputs are rounded to x's dtype before the SiLU product, as a layer's outputs are; the rest in fp32."""
    E = gate[0].shape[0]
    w = {n: [nvfp4_dequantize(p[0][e], p[1][e], p[2][e]) for e in range(E)]
         for n, p in (("g", gate), ("u", up), ("d", down))}
    xf = x.float()
    y = torch.zeros_like(xf)
    for t in range(x.shape[0]):
        for j in range(top_k_index.shape[1]):
            e = int(top_k_index[t, j])
            if not 0 <= e < E:
                continue
            g = (w["g"][e] @ xf[t]).to(x.dtype).float()
            u = (w["u"][e] @ xf[t]).to(x.dtype).float()
            h = (torch.nn.functional.silu(g) * u).to(x.dtype).float()
            y[t] += top_k_weights[t, j].float() * (w["d"][e] @ h)
    return y
