"""What every ``paracheck`` subcommand shares."""


class UsageError(Exception):
    """A command line that cannot run: printed as ``paracheck: error: <message>``, exit 2."""
