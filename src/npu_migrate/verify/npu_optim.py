"""The simulated host's `torch_npu.optim`: the fused optimizers' update, on combined tensors, as torch_npu writes it.

A reference of `torch_npu.optim.NpuFused{SGD,Adam,AdamW,Adadelta,RMSprop}` (torch_npu 2.14.0
`optim/npu_fused_*.py`; the same in 2.1.0.post8), built from their Python source, not copied: at the first
`step()` the parameters of a group with a gradient are gathered per dtype (float32 and float16 only, a
TypeError otherwise, `npu_fused_optim_base.py:56-78`) into one combined tensor, and every step applies the
class's formula to the combined parameters, gradients and state at once. The device keeps each parameter
and gradient as a view of its combined tensor (`npu_combine_tensors`); here the combined tensors are
gathered from the parameters each step and written back, and what the view would break is an error:

* a gradient that is not the tensor it was at the first step (set to None by `model.zero_grad()`, then
  made anew by the backward pass) raises RuntimeError; on the device the step would silently read the
  stale combined gradient and leave the parameter as it is;
* a parameter whose storage changed (`model.cpu()`, `.to()`, `.half()` after the optimizer was built)
  raises RuntimeError likewise;
* `zero_grad(set_to_none=True)` raises ValueError, as on the device (`npu_fused_optim_base.py:136-139`);
  `zero_grad()` zeroes the gradients in place.

`state_dict()` holds the combined state, not torch_npu's per-parameter one: saving and loading a fused
optimizer's state is not modelled.
"""

from __future__ import annotations

import math

import torch
from torch.optim.optimizer import Optimizer

_FUSED_DTYPES = (torch.float32, torch.float16)


class NpuFusedOptimizerBase(Optimizer):
    def __init__(self, params, defaults) -> None:
        super().__init__(params, defaults)
        # group index -> [(params, grads, their data pointers)] per dtype, made at the first step
        self._combined: list[list[tuple[list[torch.Tensor], list[torch.Tensor], list[int]]]] | None = None
        self._combined_state: dict[tuple[int, int], dict] = {}
        self.is_fused_optimizer = True

    def _combine(self) -> None:
        combined = []
        for group in self.param_groups:
            by_dtype: dict[torch.dtype, list[torch.Tensor]] = {dtype: [] for dtype in _FUSED_DTYPES}
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.dtype not in by_dtype:
                    raise TypeError(
                        f"Fused optimizer's parameters must be either float32 or float16, but received {p.dtype}"
                    )
                by_dtype[p.dtype].append(p)
            combined.append([(ps, [p.grad for p in ps], [p.data_ptr() for p in ps]) for ps in by_dtype.values() if ps])
        self._combined = combined

    def _gathered(self, index: int, part: int) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
        params, grads, pointers = self._combined[index][part]
        for p, grad, pointer in zip(params, grads, pointers):
            if p.grad is not grad:
                raise RuntimeError(
                    "a gradient was replaced after the fused optimizer's first step (zero_grad(set_to_none=True), "
                    "model.zero_grad(), p.grad = ...): on an NPU torch_npu's fused step would keep reading the "
                    "old combined gradient and not update this parameter"
                )
            if p.data_ptr() != pointer:
                raise RuntimeError(
                    "a parameter was re-allocated after the fused optimizer's first step (.cpu(), .to(), .half(), "
                    "p.data = ...): on an NPU torch_npu's fused step would update the old combined copy"
                )
        flat_params = torch.cat([p.detach().reshape(-1) for p in params])
        flat_grads = torch.cat([g.reshape(-1) for g in grads])
        return params, flat_params, flat_grads

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._combined is None:
            self._combine()
        for index, group in enumerate(self.param_groups):
            for part in range(len(self._combined[index])):
                params, flat_params, flat_grads = self._gathered(index, part)
                state = self._combined_state.setdefault((index, part), {"step": 0})
                state["step"] += 1
                self._update(group, flat_params, flat_grads, state)
                offset = 0
                for p in params:
                    p.copy_(flat_params[offset : offset + p.numel()].view_as(p))
                    offset += p.numel()
        return loss

    @torch.no_grad()
    def zero_grad(self, set_to_none: bool = False) -> None:
        if set_to_none:
            raise ValueError("set_to_none is not supported in fused optimizers")
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.grad.zero_()

    def _update(self, group: dict, param: torch.Tensor, grad: torch.Tensor, state: dict) -> None:
        raise NotImplementedError


class NpuFusedSGD(NpuFusedOptimizerBase):
    """`npu_fused_sgd.py`: L2 weight decay on the gradient, momentum buffer seeded with the first gradient."""

    def __init__(self, params, lr=None, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False) -> None:
        if lr is None:
            raise TypeError("NpuFusedSGD needs a learning rate (torch.optim.optimizer.required)")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        super().__init__(
            params, dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay, nesterov=nesterov)
        )

    def _update(self, group, param, grad, state) -> None:
        if group["weight_decay"] != 0:
            grad = grad.add(param, alpha=group["weight_decay"])
        if group["momentum"] != 0:
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = grad.clone()
            else:
                state["momentum_buffer"].mul_(group["momentum"]).add_(grad, alpha=1 - group["dampening"])
            buf = state["momentum_buffer"]
            grad = grad.add(buf, alpha=group["momentum"]) if group["nesterov"] else buf
        param.add_(grad, alpha=-group["lr"])


class NpuFusedAdam(NpuFusedOptimizerBase):
    """`npu_fused_adam.py`: L2 weight decay on the gradient, bias-corrected moments."""

    decoupled = False

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False) -> None:
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad))

    def _update(self, group, param, grad, state) -> None:
        beta1, beta2 = group["betas"]
        if "exp_avg" not in state:
            state["exp_avg"] = torch.zeros_like(param)
            state["exp_avg_sq"] = torch.zeros_like(param)
            state["max_exp_avg_sq"] = torch.zeros_like(param)
        if self.decoupled:
            param.mul_(1 - group["lr"] * group["weight_decay"])
        elif group["weight_decay"] != 0:
            grad = grad.add(param, alpha=group["weight_decay"])
        bias_correction1 = 1 - beta1 ** state["step"]
        bias_correction2 = 1 - beta2 ** state["step"]
        exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
        exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        second = exp_avg_sq
        if group["amsgrad"]:
            torch.max(state["max_exp_avg_sq"], exp_avg_sq, out=state["max_exp_avg_sq"])
            second = state["max_exp_avg_sq"]
        denom = (second.sqrt() / math.sqrt(bias_correction2)).add_(group["eps"])
        param.addcdiv_(exp_avg, denom, value=-group["lr"] / bias_correction1)


class NpuFusedAdamW(NpuFusedAdam):
    """`npu_fused_adamw.py`: Adam with the weight decay applied to the parameter (decoupled)."""

    decoupled = True

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad)


class NpuFusedAdadelta(NpuFusedOptimizerBase):
    """`npu_fused_adadelta.py`."""

    def __init__(self, params, lr=1.0, rho=0.9, eps=1e-6, weight_decay=0) -> None:
        super().__init__(params, dict(lr=lr, rho=rho, eps=eps, weight_decay=weight_decay))

    def _update(self, group, param, grad, state) -> None:
        rho, eps = group["rho"], group["eps"]
        if "square_avg" not in state:
            state["square_avg"] = torch.zeros_like(param)
            state["acc_delta"] = torch.zeros_like(param)
        if group["weight_decay"] != 0:
            grad = grad.add(param, alpha=group["weight_decay"])
        square_avg, acc_delta = state["square_avg"], state["acc_delta"]
        square_avg.mul_(rho).addcmul_(grad, grad, value=1 - rho)
        std = square_avg.add(eps).sqrt_()
        delta = acc_delta.add(eps).sqrt_().div_(std).mul_(grad)
        param.add_(delta, alpha=-group["lr"])
        acc_delta.mul_(rho).addcmul_(delta, delta, value=1 - rho)


class NpuFusedRMSprop(NpuFusedOptimizerBase):
    """`npu_fused_rmsprop.py`."""

    def __init__(self, params, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0, momentum=0, centered=False) -> None:
        super().__init__(
            params, dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay, momentum=momentum, centered=centered)
        )

    def _update(self, group, param, grad, state) -> None:
        alpha = group["alpha"]
        if "square_avg" not in state:
            state["square_avg"] = torch.zeros_like(param)
            state["grad_avg"] = torch.zeros_like(param)
            state["momentum_buffer"] = torch.zeros_like(param)
        if group["weight_decay"] != 0:
            grad = grad.add(param, alpha=group["weight_decay"])
        square_avg = state["square_avg"]
        square_avg.mul_(alpha).addcmul_(grad, grad, value=1 - alpha)
        if group["centered"]:
            grad_avg = state["grad_avg"]
            grad_avg.mul_(alpha).add_(grad, alpha=1 - alpha)
            avg = square_avg.addcmul(grad_avg, grad_avg, value=-1).sqrt_().add_(group["eps"])
        else:
            avg = square_avg.sqrt().add_(group["eps"])
        if group["momentum"] > 0:
            buf = state["momentum_buffer"]
            buf.mul_(group["momentum"]).addcdiv_(grad, avg)
            param.add_(buf, alpha=-group["lr"])
        else:
            param.addcdiv_(grad, avg, value=-group["lr"])


#: The names the stand-in `torch_npu.optim` holds.
CLASSES = {
    cls.__name__: cls
    for cls in (NpuFusedOptimizerBase, NpuFusedSGD, NpuFusedAdam, NpuFusedAdamW, NpuFusedAdadelta, NpuFusedRMSprop)
}
