"""``python -m paracheck.world._entry ...``: the command line of one rank process.

A separate module so that ``paracheck.world._rank`` is imported normally (runpy warns when the
module it runs as __main__ was already imported through its package).
"""

import signal
import sys

if __name__ == "__main__":
    # Ctrl-C on a terminal reaches every process of the foreground group, the ranks included:
    # the driver alone handles it (it reports what finished and ends the ranks), so a rank
    # ignores it rather than print a KeyboardInterrupt of its own. The driver starts this process
    # with SIGINT blocked (_processes._sigint_blocked), so that none arrives before this line; set
    # first, before torch is imported, and inherited by the zygote's forks.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})

from paracheck.world._rank import rank_main  # noqa: E402

if __name__ == "__main__" and sys.argv[1] == "zygote":
    from paracheck.world._rank import zygote_main

    zygote_main(sys.argv[2])
elif __name__ == "__main__":
    _rank, _host, _port, _driver, _stacks, _backend, _device, _timeout = sys.argv[1:9]
    rank_main(
        int(_rank), _host, int(_port), _driver, _stacks, _backend, _device or None, float(_timeout)
    )
