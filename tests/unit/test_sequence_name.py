"""The derandomised sequence of a file target does not depend on where the file lives."""

from paracheck.check.property import sequence_name


def test_a_file_targets_directory_does_not_pick_its_sequence():
    assert sequence_name("/home/a/repo/ddp.py:DDP") == sequence_name("/tmp/ci/ddp.py:DDP")
    assert sequence_name("/home/a/repo/ddp.py:DDP") == "ddp.py:DDP"


def test_module_targets_and_names_keep_their_whole_path():
    assert sequence_name("pkg.ddp:DDP") == "pkg.ddp:DDP"
    assert sequence_name("pkg.ddp:DDP") != sequence_name("other.ddp:DDP")
    assert sequence_name("/r/a.py:DDP") != sequence_name("/r/a.py:Other")
