"""The learning rate at each step, and Muon's momentum: what the `schedule` and `optimizer=muon` knobs change.

Both schedules warm up linearly to optim.lr over optim.lr_warmup_steps. cosine then decays to optim.min_lr at the
last step (nanoGPT's); wsd, warmup-stable-decay (arXiv 2405.18392), holds optim.lr and decays linearly to
optim.min_lr over the last `cooldown_fraction` of the steps, so one run's stable phase can be cut short anywhere.
"""

import math

from benchlab.core.knobs import RunSettings
from benchlab.core.sections import OptimParams

# Muon's momentum warm-up: modded-nanogpt raises it from 0.85 to 0.95 over its first 300 steps. A shorter run
# (the CPU's) ends inside the warm-up, as a speedrun's first 300 steps would.
MUON_MOMENTUM = (0.85, 0.95)
MUON_MOMENTUM_WARMUP_STEPS = 300


def lr_at(step: int, total: int, optim: OptimParams, settings: RunSettings) -> float:
    """The learning rate of step `step` (0-based) of `total`."""
    warm = min(optim.lr_warmup_steps, total - 1)
    if step < warm:
        return optim.lr * (step + 1) / warm
    if settings.schedule == "wsd":
        cooldown = max(1, round(settings.cooldown_fraction * total))
        start = max(warm, total - cooldown)  # the decay's first step
        if step < start:
            return optim.lr
        progress = (step - start + 1) / max(1, total - start)  # reaches min_lr at the last step
        return optim.lr + progress * (optim.min_lr - optim.lr)
    progress = (step - warm) / max(1, total - 1 - warm)
    return optim.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (optim.lr - optim.min_lr)


def muon_momentum(step: int, warmup_steps: int = MUON_MOMENTUM_WARMUP_STEPS) -> float:
    """Muon's momentum at step `step`: linear from 0.85 to 0.95 over `warmup_steps`, then 0.95."""
    low, high = MUON_MOMENTUM
    frac = min(1.0, step / warmup_steps) if warmup_steps > 0 else 1.0
    return low + frac * (high - low)
