"""moe_ref: an independent PyTorch mixture-of-experts feed-forward (issue 38),
written as Hugging Face's Mixtral / Qwen2-MoE / DeepSeek-V3 blocks are: a
router, a loop over experts each running its own MLP on the tokens routed
to it (index_add_ of the weighted outputs), shared experts added — not as
pipewright computes it (a sorted order and grouped products, ops_moe.h).

model.moe (docs/contracts.md#models):
  experts E, top_k K, ffn_hidden H (each expert's width), gate
  "softmax_topk" (softmax over the K chosen logits: Mixtral) | "softmax"
  (softmax over all E, the K chosen kept: Qwen2-MoE) | "sigmoid"
  (DeepSeek-V3: s = sigmoid(logit), chosen by s + bias, weights
  s / sum(chosen s) * routed_scale), shared_experts S (one MLP of S * H),
  every / first_dense (which blocks are MoE), aux_loss (Switch's
  load-balancing loss coefficient).
Parameters of block i (p = "blocks.i."): p + "moe.router.weight" (E, d),
p + "moe.experts.gate.weight" (E*H, d), "...up.weight" (E*H, d),
"...down.weight" (E*d, H) (expert e's rows e*H .. e*H+H-1, resp. e*d ..;
gpt's experts: "fc" and "proj", no gate), p + "moe.shared.*" (S*H wide)
when S > 0.
"""
import torch
import torch.nn.functional as F


def moe_config(m):
    """The model.moe object with its defaults, or None."""
    mo = m.get("moe")
    if not mo:
        return None
    d = int(m["d_model"])
    return {
        "E": int(mo["experts"]),
        "K": int(mo.get("top_k", 2)),
        "H": int(mo.get("ffn_hidden", m.get("ffn_hidden", 4 * d))),
        "gate": mo.get("gate", "softmax_topk"),
        "scale": float(mo.get("routed_scale", 1.0)),
        "S": int(mo.get("shared_experts", 0)),
        "SH": int(mo.get("shared_ffn_hidden", 0)),  # the shared MLP's width; 0: S * H
        "sgate": bool(mo.get("shared_gate", False)),  # Qwen2-MoE's sigmoid gate on the shared MLP
        "every": int(mo.get("every", 1)),
        "first_dense": int(mo.get("first_dense", 0)),
        "aux": float(mo.get("aux_loss", 0.0)),
    }


def is_moe_block(mc, i):
    return mc is not None and i >= mc["first_dense"] and (i - mc["first_dense"]) % mc["every"] == 0


def moe_param_shapes(mc, p, d, llama):
    """Block p's mixture parameters: llama's SwiGLU experts gate/up/down,
    gpt's GELU experts fc/proj (no biases either way)."""
    E, H, S = mc["E"], mc["H"], mc["S"]
    shapes = {p + "moe.router.weight": (E, d)}
    for part, n in (("experts", E), ("shared", S)):
        if not n:
            continue
        rows = E * H if part == "experts" else (mc["SH"] or S * H)
        if llama:
            shapes.update({p + f"moe.{part}.gate.weight": (rows, d), p + f"moe.{part}.up.weight": (rows, d)})
        else:
            shapes[p + f"moe.{part}.fc.weight"] = (rows, d)
        down = p + f"moe.{part}.{'down' if llama else 'proj'}.weight"
        shapes[down] = (E * d, H) if part == "experts" else (d, rows)
    if S and mc["sgate"]:
        shapes[p + "moe.shared_gate.weight"] = (1, d)
    return shapes


def route(logits, mc, bias=None):
    """(weights (N, K), ids (N, K)) of each token's K experts, best first;
    equal scores go to the lower expert index (a stable sort)."""
    K = mc["K"]
    if mc["gate"] == "sigmoid":
        s = torch.sigmoid(logits)
        choose = s + bias if bias is not None else s
        ids = torch.sort(-choose.detach(), dim=-1, stable=True).indices[:, :K]
        w = s.gather(1, ids)
        return w / w.sum(-1, keepdim=True) * mc["scale"], ids
    ids = torch.sort(-logits.detach(), dim=-1, stable=True).indices[:, :K]
    if mc["gate"] == "softmax_topk":
        return F.softmax(logits.gather(1, ids), dim=-1), ids
    return F.softmax(logits, dim=-1).gather(1, ids), ids


def mlp(P, p, x, act, rows=None):
    """One MLP of block p's part p (p + "gate"/"up"/"down", or gpt's "fc"/"proj"), rows = (lo, hi, dlo, dhi) of
    an expert's slice of the stacked weights."""
    sl = (lambda w, lo, hi: w[lo:hi]) if rows else (lambda w, lo, hi: w)
    lo, hi, dlo, dhi = rows or (0, 0, 0, 0)
    if act == "gelu":  # gpt's experts
        g = F.gelu(x @ sl(P[p + "fc.weight"], lo, hi).t(), approximate="tanh")
        return g @ sl(P[p + "proj.weight"], dlo, dhi).t()
    g = x @ sl(P[p + "gate.weight"], lo, hi).t()
    g = F.gelu(g, approximate="tanh") if act == "gelu_tanh" else F.silu(g)
    return (g * (x @ sl(P[p + "up.weight"], lo, hi).t())) @ sl(P[p + "down.weight"], dlo, dhi).t()


def moe_ffn(P, p, x, mc, act="silu"):
    """x (B, T, d) -> (y (B, T, d), the aux loss term, tokens per expert).
    act: "silu" / "gelu_tanh" (llama's gated experts) or "gelu" (gpt's)."""
    B, T, d = x.shape
    E, H = mc["E"], mc["H"]
    h = x.reshape(-1, d)
    logits = h @ P[p + "moe.router.weight"].t()
    w, ids = route(logits, mc, P.get(p + "moe.router.bias"))
    y = torch.zeros_like(h)
    counts = []
    for e in range(E):  # as transformers' MixtralSparseMoeBlock: each expert on its tokens
        tok, slot = (ids == e).nonzero(as_tuple=True)
        counts.append(int(tok.numel()))
        if tok.numel() == 0:
            continue
        out = mlp(P, p + "moe.experts.", h[tok], act, (e * H, (e + 1) * H, e * d, (e + 1) * d))
        y.index_add_(0, tok, out * w[tok, slot].unsqueeze(-1))
    if mc["S"]:  # as transformers' Qwen2MoeSparseMoeBlock: sigmoid(shared_expert_gate(h)) * shared_expert(h)
        sh = mlp(P, p + "moe.shared.", h, act)
        if mc["sgate"]:
            sh = torch.sigmoid(h @ P[p + "moe.shared_gate.weight"].t()) * sh
        y = y + sh
    aux = torch.zeros(())
    if mc["aux"] > 0:  # Switch Transformer's: E * sum_e (fraction routed to e) * (mean router prob of e)
        probs = torch.sigmoid(logits) if mc["gate"] == "sigmoid" else F.softmax(logits, dim=-1)
        frac = torch.tensor(counts, dtype=h.dtype) / (h.shape[0] * mc["K"])
        aux = mc["aux"] * E * (frac * probs.mean(0)).sum()
    return y.view(B, T, d), aux, counts
