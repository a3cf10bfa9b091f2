"""Bad input to ``paracheck gate`` and ``paracheck report`` is exit 2 with one line naming the
option, its value and the rule, found before anything is measured or built; never a traceback."""

import json
import os
import subprocess

import pytest

from paracheck.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def repo(tmp_path):
    """A git repository of one commit."""
    path = tmp_path / "repo"
    path.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@localhost", "-c", "commit.gpgsign=false"]
    subprocess.run(git + ["init", "-q", "-b", "main"], cwd=path, check=True)
    (path / "a.py").write_text("A = 1\n")
    subprocess.run(git + ["add", "-A"], cwd=path, check=True)
    subprocess.run(git + ["commit", "-q", "-m", "one"], cwd=path, check=True)
    return path


@pytest.mark.parametrize(
    "extra, says",
    [
        (["--rounds", "100000"], "--rounds=100000 must be <= 400"),
        (["--timeout", "0"], "--timeout=0.0 must be > 0"),
        (["--model", "nosuch"], "--model='nosuch' must be one of"),
        (["--base", "nosuch"], "--base='nosuch' is not a commit of"),
        (["--head", "nosuch"], "--head='nosuch' is not a commit of"),
        (["--json", "{tmp}/missing/v.json"], "--json='{tmp}/missing/v.json' cannot be written"),
        (["--json", "{tmp}"], "--json='{tmp}' is a directory"),
        (["--history", "{tmp}/afile"], "--history='{tmp}/afile' is not a directory"),
    ],
)
def test_gate_bad_option_is_exit_2_naming_it(repo, tmp_path, capsys, extra, says):
    """Each bad option: exit 2 and a message naming it and its value, before any worker starts
    (a wrong --json path used to be found after the rounds, with a traceback)."""
    (tmp_path / "afile").write_text("")
    extra = [e.replace("{tmp}", str(tmp_path)) for e in extra]
    argv = ["gate", "--repo", str(repo), "--base", "HEAD", *extra, "mypkg.ddp:MyDDP"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert says.replace("{tmp}", str(tmp_path)) in err and "Traceback" not in err, err


@pytest.mark.parametrize(
    "repo_arg, says",
    [("{tmp}/nowhere", "is not a directory"), ("{tmp}", "is not a git repository")],
)
def test_gate_repo_that_is_not_a_repository_is_exit_2(tmp_path, capsys, repo_arg, says):
    """--repo naming no directory, or a directory outside git: exit 2 naming --repo."""
    path = repo_arg.replace("{tmp}", str(tmp_path))
    assert main(["gate", "--repo", path, "--base", "HEAD", "mypkg.ddp:MyDDP"]) == 2
    assert f"--repo={path!r} {says}" in capsys.readouterr().err


def test_report_bad_files_are_exit_2_naming_them(tmp_path, capsys):
    """--from-json that is not JSON, holds a list or an object of another shape; --config that
    is not a JSON object; --out naming a file: exit 2 naming the option and the path."""
    pytest.importorskip("asv")
    conf = tmp_path / "asv.conf.json"
    conf.write_text(json.dumps({"version": 1, "html_dir": "html", "results_dir": "results"}))
    cases = {
        "bad.json": ("{bad", "is not a JSON file"),
        "list.json": ("[1]", "holds a JSON list"),
        "shape.json": ('{"step": [{"median": 1}]}', "is not in the form paracheck bench --json"),
    }
    for name, (text, says) in cases.items():
        (tmp_path / name).write_text(text)
        path = str(tmp_path / name)
        argv = ["report", "--config", str(conf), "--no-publish", "--from-json", path]
        assert main(argv) == 2, name
        err = capsys.readouterr().err
        assert f"--from-json={path!r} {says}" in err, err
    bad_conf = str(tmp_path / "bad.json")
    assert main(["report", "--config", bad_conf]) == 2
    assert f"--config={bad_conf!r} is not an asv configuration" in capsys.readouterr().err
    out = str(tmp_path / "list.json")
    assert main(["report", "--config", str(conf), "--no-publish", "--out", out]) == 2
    assert f"--out={out!r} is not a directory" in capsys.readouterr().err


def test_report_without_asv_says_what_to_install(monkeypatch, capsys):
    """Without the benchmark extras ``paracheck report`` is exit 2 naming what to install, not
    an ImportError's traceback."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "asv" else real(name, *a)
    )
    assert main(["report"]) == 2
    err = capsys.readouterr().err
    assert "needs asv, not installed" in err and "-e '.[bench]'" in err, err
