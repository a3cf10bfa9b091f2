"""The overlapped and bucketed DDPs as they were at commit 9e54654, for
``experiments/diag_overlap_regression.py``: the sources of ``paracheck/ddp/`` copied verbatim but
for relative imports and one test path in a docstring (the test has moved since)."""
