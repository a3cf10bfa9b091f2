"""The session's World lent to a command that closes the World it is given (``paracheck check``
run in this process): everything but ``close()`` goes to the session's World."""


class Borrowed:
    def __init__(self, world):
        self._world = world

    def __getattr__(self, name):
        return getattr(self._world, name)

    def close(self) -> None:
        pass  # the session closes it
