"""Shared helpers of the Python tests: the independent oracle, and whether Plan::backward exists yet."""
from __future__ import annotations

import functools
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "oracle"))
import patterns_oracle  # noqa: E402  (tests/oracle: PATTERNS.md re-implemented in numpy, never from the C++)

import spattn  # noqa: E402


@functools.lru_cache(maxsize=None)
def backward_missing(device: str = "cpu") -> str:
    """'' when Plan::backward runs on `device`, else the C++ library's reason (it throws until implemented)."""
    if device == "cpu":
        q = np.ones((1, 64, 1, 64), np.float32)
    else:
        import torch

        q = torch.ones((1, 64, 1, 64), dtype=torch.bfloat16, device=device)
    p = spattn.plan("local(1)", 64, 64, 1, 1, 64, device, dtype=q.dtype)
    o, lse = p.forward(q, q, q, return_lse=True)
    try:
        p.backward(q, q, q, o, lse, o)
    except spattn.Error as e:
        if "not implemented" in str(e):
            return str(e)
        raise
    return ""


def need_backward(device: str = "cpu") -> None:
    """Skips the calling test, with the C++ message, while Plan::backward is not implemented on `device`."""
    why = backward_missing(device)
    if why:
        pytest.skip(f"needs Plan::backward on {device}: {why}")


def oracle(q, k, v, spec, scale=None):
    """O [B, Lq, Hq, Dv] and LSE [B, Hq, Lq] in float64 from the independent oracle ([B, L, H, D] inputs)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    m = patterns_oracle.mask(spec, q.shape[1], k.shape[1])
    return patterns_oracle.attention(q, k, v, m, scale=scale, Hkv=k.shape[2])


def oracle_grads(q, k, v, spec, dout, scale=None):
    """dQ, dK, dV in float64 for O = softmax(scale Q K^T + mask) V, from the independent oracle."""
    m = patterns_oracle.mask(spec, np.shape(q)[1], np.shape(k)[1])
    return patterns_oracle.attention_grads(q, k, v, dout, m, scale=scale, Hkv=np.shape(k)[2])
