"""``python -m paracheck.bench bench|memory|gate|report ...``: the same as ``paracheck ...``."""

import sys

import paracheck.bench as _bench

_COMMANDS = ("bench", "memory", "gate", "report")


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in _COMMANDS:
        print(f"usage: python -m paracheck.bench {{{','.join(_COMMANDS)}}} ...", file=sys.stderr)
        return 2
    return int(getattr(_bench, f"{argv[0]}_main")(argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
