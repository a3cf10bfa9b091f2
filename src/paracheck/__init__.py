"""paracheck: proves data-parallel PyTorch training equal to single-process training.

Importing paracheck touches no distributed state and imports neither triton nor the runner.
"""

__version__ = "0.1.0"
