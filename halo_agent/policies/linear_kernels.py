"""Which kernel a served model's linear layers run on a CPU.

A small model's decode forward on a CPU is bound by reading its weights. torch's ``F.linear`` runs MKL's sgemm,
which for 2 or 3 rows costs about as many single-row products: a forward advancing 2 choice walks took as long
as 2 forwards of one (1.08x). oneDNN's linear (``torch.ops.mkldnn._linear_pointwise``, the kernel torch's own
compiler fuses into on a CPU) reads the weights once for every row: the same 2-walk forward took 0.71x of two
forwards, a 500-token prefill 0.84x (SmolLM2-135M, fp32, 2 threads, ``python -m bench engine-batch``; the
trainer's first-update ratios within 5.1e-5 of 1, ``python -m bench ratios``).

``use_onednn_linear`` switches every ``nn.Linear`` of a model (adapters loaded later keep torch's: a LoRA
factor is a few rows) to oneDNN, where torch has it, after checking one layer's output against ``F.linear``.
"""

from __future__ import annotations

import types
from typing import Any

LINEAR_KERNELS = ("auto", "onednn", "torch")  # auto: oneDNN on a CPU where torch has it, else torch's


def _onednn_forward(self: Any, x: Any) -> Any:
    import torch

    return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")


def onednn_available() -> bool:
    import torch

    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def use_onednn_linear(model: Any) -> int:
    """Run every ``nn.Linear`` of ``model`` (on a CPU) on oneDNN; returns how many. Raises ``RuntimeError`` where
    torch has no oneDNN linear or it does not agree with ``F.linear`` on the model's first layer."""
    import torch

    if not onednn_available():
        raise RuntimeError("this torch build has no oneDNN linear (torch.ops.mkldnn._linear_pointwise)")
    layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m.weight.device.type == "cpu"]
    if layers:
        first = layers[0]
        with torch.inference_mode():
            x = torch.randn(3, first.in_features, dtype=first.weight.dtype, generator=torch.Generator().manual_seed(0))
            want, got = torch.nn.functional.linear(x, first.weight, first.bias), _onednn_forward(first, x)
        if not torch.allclose(got, want, rtol=1e-4, atol=1e-4 * float(want.abs().max())):
            raise RuntimeError("oneDNN's linear disagrees with torch's on this model")
    for layer in layers:
        layer.forward = types.MethodType(_onednn_forward, layer)
    return len(layers)


def use_torch_linear(model: Any) -> int:
    """Undo ``use_onednn_linear``: every ``nn.Linear`` of ``model`` on torch's own kernel again; returns how many."""
    import torch

    layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and "forward" in vars(m)]
    for layer in layers:
        del layer.forward
    return len(layers)
