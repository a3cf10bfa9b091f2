"""Correct designs written from the CS336 interface alone, outside paracheck (without reading its
code), that paracheck once failed: each is checked on the case that failed it
(``tests/regression/test_outside_designs.py``)."""
