"""A user's package as ``paracheck gate`` sees it: one DDP wrapper, ``mypkg.ddp:MyDDP``."""
