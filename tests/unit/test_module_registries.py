"""Wrappers keep nn.Module's own registries intact (regression: BucketedDDP once replaced
``self._buffers`` with its list of bucket tensors; every attribute assignment then compared the
name with each bucket tensor, 1.8 ms per gradient hook on the GPU, 13x slower steps on xl)."""

from paracheck.check.targets import BUILTIN_TARGETS, load_object


def test_ddp_wrappers_keep_module_registries():
    """Every built-in DDP wrapper leaves _parameters/_buffers/_modules as dicts and buffers() intact
    (world size 1 without a process group: the wrappers skip communication)."""
    from paracheck.workloads import MLPSpec, build_model

    for name, (path, kind) in BUILTIN_TARGETS.items():
        if kind != "ddp" or path.startswith("paracheck.ddp.torch_ddp"):  # torch DDP needs a group
            continue
        model = build_model(MLPSpec(in_features=3, widths=(4, 2), buffer=True), seed=0)
        cls = load_object(path)
        try:
            ddp = cls(model, 1.0)
        except TypeError:
            ddp = cls(model)
        for reg in ("_parameters", "_buffers", "_modules"):
            assert isinstance(ddp.__dict__[reg], dict), (
                f"{name}: {reg} replaced by {type(ddp.__dict__[reg])}"
            )
        assert [b.data_ptr() for b in ddp.buffers()] == [b.data_ptr() for b in model.buffers()], (
            name
        )
