"""torchao's AdamW with stochastic rounding into bf16 weights, every parameter stepped by one compiled call.

torchao's `_AdamW.step` compiles `single_param_adam` and calls it once per parameter, from Python: on the H200
that made GPT-2 124M's step wait on the host, and bf16 weights stepped that way lost most of what bf16 weights
stepped by torch's fused AdamW gained (results/h200-weights/report.md has the figures). Here the
same torchao function runs over all of a group's parameters inside one compiled function, so the host makes one
call per group and the kernels follow each other without it. The arithmetic and the state are torchao's (the
moments from its `_new_buffer`, a step count per parameter); only the loop over the parameters moved into the
graph. Clipping stays torch's own pass (`clip_grad_norm_`); `fused_clip` is for torch's fused kernel only.
"""

from collections.abc import Iterable, Sequence

import torch
from torchao.optim import _AdamW
from torchao.optim.adam import single_param_adam


def _step_group(params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor], steps: Sequence[torch.Tensor],
                exp_avgs: Sequence[torch.Tensor], exp_avg_sqs: Sequence[torch.Tensor], lr: torch.Tensor,
                beta1: float, beta2: float, weight_decay: float, eps: float, rounding: tuple[bool, ...]) -> None:
    """torchao's AdamW step for each parameter of a group (decoupled weight decay, no amsgrad)."""
    for p, grad, step, exp_avg, exp_avg_sq, stochastic in zip(params, grads, steps, exp_avgs, exp_avg_sqs, rounding):
        single_param_adam(p, grad, step, exp_avg, exp_avg_sq, None, lr, beta1, beta2, weight_decay, eps, True,
                          stochastic)


class OneCallAdamW(_AdamW):
    """torchao's `_AdamW` (bf16 stochastic rounding by default) whose step is one compiled call per group."""

    def __init__(self, params: Iterable, lr: float, betas: tuple[float, float], *,
                 bf16_stochastic_round: bool = True) -> None:
        super().__init__(params, lr=lr, betas=betas, bf16_stochastic_round=bf16_stochastic_round)
        self.step_group = torch.compile(_step_group, fullgraph=True, dynamic=False)

    @torch.no_grad()
    def step(self, closure: None = None) -> None:  # type: ignore[override]
        if closure is not None:
            raise ValueError("OneCallAdamW.step takes no closure")
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            for p in params:
                state = self.state[p]
                if not state:  # as torchao's step initializes them
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = self._new_buffer(p, True)
                    state["exp_avg_sq"] = self._new_buffer(p, False)
            states = [self.state[p] for p in params]
            steps = [s["step"] for s in states]
            torch._foreach_add_(steps, 1)
            rounding = tuple(self.bf16_stochastic_round and p.dtype is torch.bfloat16 for p in params)
            self.step_group(params, [p.grad for p in params], steps, [s["exp_avg"] for s in states],
                            [s["exp_avg_sq"] for s in states], group["lr"], *group["betas"], group["weight_decay"],
                            group["eps"], rounding)
