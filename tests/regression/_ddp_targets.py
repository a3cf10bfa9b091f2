"""DDP targets for the regression tests, importable by the rank processes."""

from paracheck.ddp._common import check_bucket_size_mb
from paracheck.ddp.bucketed import BucketedDDP


class RefusesNoneDDP(BucketedDDP):
    """A correct BucketedDDP that, like many CS336 solutions, takes only a number of megabytes."""

    def __init__(self, module, bucket_size_mb: float):
        super().__init__(module, check_bucket_size_mb(bucket_size_mb))
