"""Shared fixtures: one persistent gloo World for the whole session (ranks are expensive)."""

import pytest


@pytest.fixture(scope="session")
def world(paracheck_world):
    """The plugin's session World (6 ranks by default here: the DDP properties cover world sizes 1..6)."""
    return paracheck_world
