"""A cue written outside memgas_gpu (tests/test_signal_registry.py): recency, 1 for the
latest session of the query's conversation and 0 for the others, in one register call."""
import torch

from memgas_gpu.retrieve.signals import register


def recency(ctx, names):
    lay = ctx.layout
    out = torch.zeros(lay.valid.shape, dtype=torch.float64)
    out[torch.arange(lay.n.numel()), (lay.n - 1).clamp_min(0)] = 1.0
    return {"recency": torch.where(lay.valid, out, torch.zeros_like(out)).to(ctx.device)}


register("recency", "S", "cue", recency, "1 for the latest session of the conversation")
