"""Designs written from the CS336 interfaces the way their users write them, each correct or with
one planted bug named by its docstring's first line (``scripts/corpus.py`` checks them all)."""
