"""torch DDP accepting compiled cases, for the tests that run them on rank processes that ran no
compiled torch DDP before (Note [Compiled torch DDP on reused ranks] in paracheck.ddp.torch_ddp)."""

from __future__ import annotations

from paracheck.ddp.torch_ddp import TorchDDP


class CompiledTorchDDP(TorchDDP):
    unsupported_case_features = {
        field: why
        for field, why in TorchDDP.unsupported_case_features.items()
        if field != "compiled"
    }
