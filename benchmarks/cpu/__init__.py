"""CPU tier: gloo ranks on the CPU, small LMs (``paracheck.bench.suites.CPU_MODELS``)."""
