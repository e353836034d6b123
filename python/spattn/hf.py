"""spattn as a Hugging Face ``transformers`` attention implementation: ``attn_implementation="spattn"``.

    import spattn.hf                                          # registers "spattn" (attention and mask interfaces)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="spattn")   # or from_pretrained(...)
    spattn.hf.set_patterns(model, "causal & local(left=1023, right=0)")              # optional: explicit specs

Decoder models whose attention calls ``ALL_ATTENTION_FUNCTIONS`` (Llama, Mistral, Qwen2/3, Gemma-style, GPT-OSS, ...)
run their prefill and training attention through ``spattn.torch``. Each layer's pattern comes from the config as
transformers itself would build the mask: causal (or bidirectional where ``config.is_causal`` is False), the
layer's sliding window (``sliding_window`` with ``layer_types`` of ``full_attention`` / ``sliding_attention``;
window ``w`` keeps keys ``q - w < k <= q``, ``local(left=w-1, right=0)``), packed sequences (``position_ids``
restarting inside a row: ``document(n1, n2, ...)``), right or left padding (a 2-D ``attention_mask`` whose ones are
one run per row: ``global_cols(a:b)``) and learned attention sinks (GPT-OSS's ``s_aux``: one logit per head,
computed exactly, gradient included). Or, per layer, a spec you give (``set_patterns``); padding and packing are
still applied on top of it. GQA runs without repeating K and V.

Registering a mask interface keeps transformers from building a dense mask: the model gets a ``SpattnMask``, a
description (lengths, offsets, window, padding and transformers' own mask function), and each layer checks a
sample of the rows of that mask function against the spec it derived before it runs. Where the two differ (mask
overlays spattn cannot express, such as a VLM's image blocks) and where a call is not a prefill of a whole sequence
(decoding with a cache: ``q_len != k_len`` or a cache offset; a 4-D mask passed in; non-contiguous padding), the
layer falls back to SDPA with the dense mask transformers would have built, which is exact and slower; the first
fallback of each reason logs a warning. Attention dropout and softcapping are refused (spattn has neither).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from . import Error
from .torch import _options, sparse_attention

__all__ = ["register", "set_patterns", "layer_spec", "SpattnMask", "spattn_attention_forward", "spattn_mask",
           "fallbacks"]

NAME = "spattn"
_log = logging.getLogger("spattn.hf")
_FALLBACKS: Dict[str, int] = {}


def fallbacks() -> Dict[str, int]:
    """How many attention calls ran on SDPA instead of spattn since import, by reason (a copy)."""
    return dict(_FALLBACKS)


def _fell_back(reason: str) -> None:
    if reason not in _FALLBACKS:
        _log.warning("spattn: running SDPA with the dense mask (%s)", reason)
    _FALLBACKS[reason] = _FALLBACKS.get(reason, 0) + 1


# ---- the mask interface: a description instead of a dense mask ---------------------------------------------
@dataclass
class SpattnMask:
    """What transformers' mask builders know about a mask, without the [B, 1, Lq, Lk] tensor.

    ``dense()`` builds that tensor (SDPA's boolean mask) for the fallback; ``rows(r)`` evaluates only rows ``r``."""

    batch_size: int
    q_length: int
    kv_length: int
    q_offset: int
    kv_offset: int
    mask_function: Callable
    attention_mask: Optional[Tensor]  # the 2-D padding mask [B, >= kv_length + kv_offset], or None
    local_size: Optional[int]
    use_vmap: bool
    device: Any
    _memo: dict = field(default_factory=dict, repr=False)

    @property
    def shape(self) -> Tuple[int, int, int, int]:
        return (self.batch_size, 1, self.q_length, self.kv_length)

    def padding(self) -> Optional[Tensor]:
        """The padding mask as booleans [B, kv_length] (None where every key is kept)."""
        if "padding" not in self._memo:
            m = self.attention_mask
            if m is not None:
                from transformers.masking_utils import prepare_padding_mask

                m = prepare_padding_mask(m, self.kv_length, self.kv_offset)
                m = m[:, self.kv_offset:self.kv_offset + self.kv_length].bool()
                if bool(m.all()):
                    m = None
            self._memo["padding"] = m
        return self._memo["padding"]

    def dense(self) -> Tensor:
        from transformers.masking_utils import sdpa_mask

        if "dense" not in self._memo:
            self._memo["dense"] = sdpa_mask(
                batch_size=self.batch_size, q_length=self.q_length, kv_length=self.kv_length, q_offset=self.q_offset,
                kv_offset=self.kv_offset, mask_function=self.mask_function, attention_mask=self.attention_mask,
                local_size=self.local_size, allow_is_causal_skip=False, use_vmap=self.use_vmap, device=self.device)
        return self._memo["dense"]

    def rows(self, rows: Tensor) -> Tensor:
        """The mask function (padding left out) on query rows `rows`: booleans [B, len(rows), kv_length]."""
        dev = rows.device
        b = torch.arange(self.batch_size, device=dev)[:, None, None, None]
        h = torch.zeros(1, dtype=torch.long, device=dev)[None, :, None, None]
        q = (rows + self.q_offset)[None, None, :, None]
        k = (torch.arange(self.kv_length, device=dev) + self.kv_offset)[None, None, None, :]
        out = self.mask_function(b, h, q, k)
        return torch.as_tensor(out, device=dev).expand(self.batch_size, 1, len(rows), self.kv_length)[:, 0]


def spattn_mask(batch_size: int, q_length: int, kv_length: int, q_offset: int = 0, kv_offset: int = 0,
                mask_function: Optional[Callable] = None, attention_mask: Optional[Tensor] = None,
                local_size: Optional[int] = None, use_vmap: bool = False, device: Any = "cpu",
                **kwargs: Any) -> SpattnMask:
    """transformers' mask interface for "spattn": returns a SpattnMask (no dense mask is built)."""
    if mask_function is None:
        from transformers.masking_utils import causal_mask_function as mask_function
    return SpattnMask(int(batch_size), int(q_length), int(kv_length), int(q_offset), int(kv_offset), mask_function,
                      attention_mask, None if local_size is None else int(local_size), bool(use_vmap), device)


# ---- the pattern of a layer ---------------------------------------------------------------------------------
def set_patterns(model_or_config: Any, patterns: Union[None, str, Sequence[Optional[str]], Dict[int, str],
                                                       Callable[[int, str], Optional[str]]]) -> None:
    """Gives layers explicit specs instead of the config's pattern (stored as ``config.spattn_patterns``).

    patterns: one spec for every layer, a list with one per layer (None: the config's pattern), a dict
    {layer index: spec}, a function (layer index, layer type) -> spec or None, or None to go back to the config.
    The spec is over the layer's tokens (positions 0..L-1 of a row); padding and packed documents are intersected
    with it. Example, attention sinks in the StreamingLLM sense (4 first tokens kept by every query) on sliding
    layers: ``lambda i, t: "causal & (local(left=4095, right=0) | global_cols(0:4))" if t == "sliding_attention"
    else None``."""
    config = getattr(model_or_config, "config", model_or_config)
    n = int(getattr(config, "num_hidden_layers", 0) or 0)
    types = list(getattr(config, "layer_types", None) or ["full_attention"] * n)
    if patterns is None or isinstance(patterns, str):
        table: Any = patterns
    elif callable(patterns):
        table = [patterns(i, types[i] if i < len(types) else "full_attention") for i in range(n)]
    elif isinstance(patterns, dict):
        table = [patterns.get(i) for i in range(n)]
    else:
        table = list(patterns)
        if n and len(table) != n:
            raise Error(f"patterns: {len(table)} specs for {n} layers (config.num_hidden_layers)")
    for spec in [table] if isinstance(table, str) else (table or []):
        if spec is not None:
            from . import Pattern

            Pattern(spec)  # parse now: a bad spec fails here, naming its text
    config.spattn_patterns = table


def layer_spec(config: Any, layer_idx: Optional[int], *, sliding_window: Optional[int] = None,
               is_causal: bool = True) -> Tuple[str, bool]:
    """(spec, explicit): the layer's explicit spec (set_patterns) or the config's: causal / bidirectional, with
    the sliding window where the layer has one."""
    table = getattr(config, "spattn_patterns", None)
    spec = table if isinstance(table, str) else (table[layer_idx] if table and layer_idx is not None
                                                 and layer_idx < len(table) else None)
    if spec is not None:
        return spec, True
    if sliding_window:
        w = int(sliding_window)
        return (f"causal & local(left={w - 1}, right=0)" if is_causal else f"local({w})"), False
    return ("causal" if is_causal else "dense"), False


def _documents(position_ids: Optional[Tensor], B: int, L: int) -> Optional[List[Optional[List[int]]]]:
    """Per row, the lengths of the packed sequences (positions restarting), or None for a row of one sequence."""
    if position_ids is None or position_ids.shape[-1] != L:
        return None
    pos = position_ids.reshape(-1, L).expand(B, L)
    starts = torch.ones_like(pos, dtype=torch.bool)
    starts[:, 1:] = pos[:, 1:] - pos[:, :-1] != 1
    if not bool(starts[:, 1:].any()):
        return None
    out: List[Optional[List[int]]] = []
    for row in starts.cpu():
        idx = torch.nonzero(row).flatten().tolist() + [L]
        out.append([b - a for a, b in zip(idx, idx[1:])] if len(idx) > 2 else None)
    return out


def _key_run(padding: Optional[Tensor]) -> Optional[List[Optional[Tuple[int, int]]]]:
    """Per row, the run [a, b) of kept keys (None: all kept); raises ValueError where a row's kept keys are not one run."""
    if padding is None:
        return None
    out: List[Optional[Tuple[int, int]]] = []
    for row in padding.cpu():
        idx = torch.nonzero(row).flatten()
        if len(idx) == 0:
            out.append((0, 0))
            continue
        a, b = int(idx[0]), int(idx[-1]) + 1
        if b - a != len(idx):
            raise ValueError("the padding mask of a row is not one run of kept keys")
        out.append(None if (a, b) == (0, len(row)) else (a, b))
    return out


def _row_specs(base: str, docs: Optional[list], runs: Optional[list], B: int) -> List[str]:
    specs = []
    for b in range(B):
        parts = [f"({base})"]
        if docs is not None and docs[b] is not None:
            parts.append("document(" + ", ".join(map(str, docs[b])) + ")")
        if runs is not None and runs[b] is not None:
            parts.append(f"global_cols({runs[b][0]}:{runs[b][1]})")
        specs.append(base if len(parts) == 1 else " & ".join(parts))
    return specs


def _check_rows(desc: SpattnMask, window: Optional[int], is_causal: bool, docs: Optional[list]) -> bool:
    """Whether transformers' mask function agrees, on a sample of rows, with causal / window / documents."""
    L = desc.q_length
    dev = desc.attention_mask.device if desc.attention_mask is not None else torch.device(desc.device)
    n = min(L, 48)
    rows = torch.unique(torch.cat([torch.arange(min(L, 16)), torch.linspace(0, L - 1, n).round().long(),
                                   torch.arange(max(0, L - 16), L)])).to(dev)
    got = desc.rows(rows).bool()
    q, k = rows[:, None], torch.arange(L, device=dev)[None, :]
    want = torch.ones(len(rows), L, dtype=torch.bool, device=dev)
    if is_causal:
        want &= k <= q
    if window:
        want &= (q - k < window) if is_causal else ((q - k).abs() <= window)
    want = want[None].expand(desc.batch_size, -1, -1).clone()
    if docs is not None:
        for b, lens in enumerate(docs):
            if lens is not None:
                ids = torch.repeat_interleave(torch.arange(len(lens), device=dev), torch.tensor(lens, device=dev))
                want[b] &= ids[rows][:, None] == ids[None, :]
    return bool(torch.equal(got, want))


# ---- the attention function ---------------------------------------------------------------------------------
class _SinkAttention(torch.autograd.Function):
    """softmax over the pattern's keys plus one virtual key per head with logit ``sink[h]`` and value 0 (GPT-OSS's
    learned sinks): O' = O * sigmoid(lse - sink). Backward: the op's, fed O' and w * dO' (w = sigmoid(lse - sink)),
    which is the softmax gradient over the keys and the sink together; d sink[h] = -sum (1 - w) dO' . O'."""

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, sink: Tensor, pattern: str, options: str) -> Tensor:
        o, lse = torch.ops.spattn.sparse_attention.default(q, k, v, pattern, options)
        w = torch.sigmoid(lse.float() - sink.float()[None, :, None]).transpose(1, 2)[..., None]  # [B, L, H, 1]
        out = (o.float() * w).to(o.dtype)
        ctx.save_for_backward(q, k, v, out, lse, w)
        ctx.args = (pattern, options, sink.dtype)
        return out

    @staticmethod
    def backward(ctx: Any, dout: Tensor) -> Tuple[Any, ...]:
        q, k, v, out, lse, w = ctx.saved_tensors
        pattern, options, sink_dtype = ctx.args
        dq, dk, dv = torch.ops.spattn.sparse_attention_backward.default(
            q, k, v, out, lse, (dout.float() * w).to(dout.dtype), pattern, options)
        dsink = -((1 - w[..., 0]) * (dout.float() * out.float()).sum(-1)).sum((0, 1))
        return dq, dk, dv, dsink.to(sink_dtype), None, None


def _sdpa(module: Any, query: Tensor, key: Tensor, value: Tensor, mask: Optional[Tensor], scaling: Optional[float],
          s_aux: Optional[Tensor], is_causal: bool) -> Tensor:
    """The fallback: SDPA (or, with sinks, the same dense softmax with the sink column) over the dense mask."""
    if s_aux is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, mask, scaling=scaling, is_causal=is_causal)[0]
    g = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(g, 1), value.repeat_interleave(g, 1)
    s = torch.matmul(query, key.transpose(2, 3)) * (scaling if scaling is not None else query.shape[-1] ** -0.5)
    if mask is None and is_causal:  # queries are the last Lq positions of the Lk keys
        mask = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril(s.shape[-1] - s.shape[-2])
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    s = torch.cat([s, s_aux.reshape(1, -1, 1, 1).expand(s.shape[0], -1, s.shape[2], 1).to(s.dtype)], -1)
    p = torch.softmax(s.float(), -1)[..., :-1].to(value.dtype)
    return torch.matmul(p, value).transpose(1, 2).contiguous()


def spattn_attention_forward(module: torch.nn.Module, query: Tensor, key: Tensor, value: Tensor,
                             attention_mask: Union[None, Tensor, SpattnMask], dropout: float = 0.0,
                             scaling: Optional[float] = None, is_causal: Optional[bool] = None,
                             sliding_window: Optional[int] = None, s_aux: Optional[Tensor] = None,
                             **kwargs: Any) -> Tuple[Tensor, None]:
    """transformers' attention interface for "spattn": query [B, Hq, Lq, D], key/value [B, Hkv, Lk, D];
    returns ([B, Lq, Hq, D], None) as the SDPA integration does."""
    if dropout:
        raise Error(f"attention dropout {dropout}: spattn has no dropout (set config.attention_dropout = 0)")
    if kwargs.get("softcap") is not None:
        raise Error("attention softcapping: not supported by spattn")
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    B, _, Lq, _ = query.shape
    Lk = key.shape[2]
    desc = attention_mask if isinstance(attention_mask, SpattnMask) else None
    reason = ""
    if isinstance(attention_mask, Tensor):
        reason = "a dense mask was passed in"
    elif Lq != Lk or Lq <= 1 or (desc is not None and (desc.q_offset or desc.kv_offset)):
        reason = "decoding or a prefill after cached tokens"
    elif desc is not None and desc.use_vmap:
        reason = "the model adds its own mask overlays"
    if not reason:
        window = desc.local_size if desc is not None and desc.local_size else sliding_window
        config = getattr(module, "config", None)
        base, explicit = layer_spec(config, getattr(module, "layer_idx", None), sliding_window=window,
                                    is_causal=causal)
        pos = kwargs.get("position_ids")
        memo = desc._memo if desc is not None else {}  # per forward: layers share the mask (no host sync per layer)
        if ("documents", id(pos)) not in memo:
            memo["documents", id(pos)] = _documents(pos, B, Lq)
        docs = memo["documents", id(pos)]
        if "runs" not in memo:
            try:
                memo["runs"] = _key_run(desc.padding() if desc is not None else None)
            except ValueError as e:
                memo["runs"] = str(e)
        runs = memo["runs"]
        if isinstance(runs, str):
            runs, reason = None, runs
        if not reason and desc is not None and not explicit and not torch.compiler.is_compiling():
            # transformers packs documents only without a cache and a 2-D mask: which of (documents, none) its
            # mask function agrees with (on a sample of rows) decides; neither is an overlay spattn does not model
            memo_key = ("docs", window, causal, id(kwargs.get("position_ids")))
            if memo_key not in desc._memo:
                ok = [d for d in ([docs, None] if docs is not None else [None]) if _check_rows(desc, window, causal, d)]
                desc._memo[memo_key] = ok[0] if ok else False
            docs = desc._memo[memo_key]
            if docs is False:
                reason = "transformers' mask differs from the config's pattern (an overlay spattn does not model)"
    if reason:
        _fell_back(reason)
        mask = desc.dense() if desc is not None else attention_mask
        return _sdpa(module, query, key, value, mask, scaling, s_aux, causal and mask is None), None
    specs = _row_specs(base, docs, runs, B)
    q, k, v = (x.transpose(1, 2) for x in (query, key, value))  # [B, L, H, D] views: read in place
    if all(s == specs[0] for s in specs):
        groups = [(slice(0, B), specs[0])]
    else:
        groups = [(slice(b, b + 1), s) for b, s in enumerate(specs)]
    outs = []
    for rows, spec in groups:
        if s_aux is None:
            outs.append(sparse_attention(q[rows], k[rows], v[rows], spec, scale=scaling))
        else:
            from .torch import _autocast

            qq, kk, vv = _autocast(q[rows], k[rows], v[rows])
            outs.append(_SinkAttention.apply(qq, kk, vv, s_aux, spec, _options("blhd", scaling)))
    return (outs[0] if len(outs) == 1 else torch.cat(outs)), None


def register(name: str = NAME) -> str:
    """Registers spattn with transformers' AttentionInterface and AttentionMaskInterface under `name`."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(name, spattn_attention_forward)
    AttentionMaskInterface.register(name, spattn_mask)
    return name


register()
