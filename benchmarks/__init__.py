"""paracheck's asv suite: ``cpu`` (gloo, minutes on 2 cores) and ``gpu`` (NCCL, skipped without
GPUs) tiers. Measuring code lives in ``paracheck.bench``; see ``asv.conf.json`` for how to run."""
