"""Bad values to ``bench``, ``memory``, ``gate``, ``selftest`` and ``check`` are usage errors
(exit 2, one line naming the option and the value) found before any rank starts."""

import pytest

import paracheck.world
from paracheck.cases import Case
from paracheck.cli import main


@pytest.fixture(autouse=True)
def no_world(monkeypatch):
    class Refused:
        def __init__(self, *a, **k):
            raise AssertionError("ranks were started for a usage error")

    monkeypatch.setattr(paracheck.world, "World", Refused)
    import paracheck.cli.check as cli_check

    monkeypatch.setattr(cli_check, "_make_world", Refused)


@pytest.mark.parametrize(
    "argv, said",
    [
        (
            ["bench", "--what", "step", "--world-size", "100"],
            "--world-size=100: world size 100 is more gloo ranks",
        ),
        (["bench", "--what", "step", "--bucket-mb", "0"], "--bucket-mb=0.0 must be > 0"),
        (["bench", "--what", "step", "--buckets", "1,-5"], "--buckets: -5.0 must be > 0"),
        (["bench", "--what", "step", "--steps", "0"], "--steps=0 must be >= 1"),
        (["bench", "--what", "step", "--variants", "nosuch"], "--variants: 'nosuch' is neither"),
        (["memory", "--world-size", "0"], "--world-size=0 must be >= 1"),
        (
            ["gate", "--base", "HEAD", "--world-size", "100", "m:C"],
            "--world-size=100: world size 100",
        ),
        (["gate", "--base", "HEAD", "--bucket-mb", "0", "m:C"], "--bucket-mb=0.0 must be > 0"),
        (
            ["selftest", "--only", "no-such-mutant"],
            "--only='no-such-mutant': unknown ['no-such-mutant']",
        ),
        (["selftest", "--only"], "--only='': give at least one name"),
        (["selftest", "--only", "naive", "--timeout", "0"], "--timeout=0.0 must be > 0"),
        (
            ["selftest", "--only", "naive", "--table", "/no/such/folder/t.md"],
            "the folder '/no/such/folder' does not exist",
        ),
        (["check", "loop", "--clip-norm=-1"], "--clip-norm=-1.0 must be a finite number > 0"),
        (["check", "loop", "--clip-norm", "nan"], "--clip-norm=nan must be a finite number > 0"),
        (
            ["check", "naive", "--json", "/no/such/folder/v.json"],
            "the folder '/no/such/folder' does not exist",
        ),
        (
            [
                "check",
                "bucketed",
                "--case",
                Case(world_size=1, batch_sizes=(1,), steps=1)
                .to_json()
                .replace('"bucket_size_mb": null', '"bucket_size_mb": 0'),
            ],
            "bucket_size_mb=0 must be > 0",
        ),
        (["check", "naive", "--case", ""], "--case='': not a case"),
        (
            ["check", "paracheck.ddp:FlatDDP", "--kind", "sharded"],
            "--kind sharded: paracheck.ddp:FlatDDP.__init__ takes (module), not (params, "
            "optimizer_cls, ...)",
        ),
        (
            ["check", "torch.optim:SGD", "--kind", "sharded"],
            "torch.optim:SGD.__init__ takes (params, lr, ...): an optimizer, not a wrapper",
        ),
        (
            ["check", "paracheck.ddp:FlatDDP", "--kind", "zero"],
            "takes (module), not (module, optimizer_cls, ...)",
        ),
        (
            ["check", "paracheck.ddp:FlatDDP", "--kind", "loop"],
            "--kind=loop does not fit paracheck.ddp:FlatDDP: FlatDDP is a class",
        ),
        (
            ["check", "paracheck.zero:Zero1", "--kind", "ddp"],
            "--kind=ddp does not fit: ",
        ),
        (["check", "naive", "--budget=-1"], "--budget=-1.0 must be a number of seconds >= 0"),
        (
            ["check", "naive", "--properties", "state"],
            "--properties='state': --properties state selects none of the properties of naive",
        ),
    ],
)
def test_a_bad_value_is_a_usage_error(argv, said, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert said in err, err
    assert "Traceback" not in err
