"""Forward, backward and AdamW step of one LM in one process, fp32 and bf16 autocast."""

from paracheck.bench.asvtools import key, measure_lm, require

MODELS = ["gate", "cpu"]
AUTOCAST = [False, True]


def measure(*_):
    return measure_lm(device="cpu", models=MODELS)


measure.timeout = 600


class LMPhases:
    """Median time of each phase over 5 steps after 2 warm-up steps."""

    params = [MODELS, AUTOCAST]
    param_names = ["model", "autocast"]
    setup_cache = measure
    timeout = 600

    def setup(self, results, model, autocast):
        self.r = require(results, key(model, autocast))

    def track_forward(self, results, model, autocast):
        return self.r["forward"]

    track_forward.unit = "seconds"

    def track_backward(self, results, model, autocast):
        return self.r["backward"]

    track_backward.unit = "seconds"

    def track_step(self, results, model, autocast):
        return self.r["step"]

    track_step.unit = "seconds"


class LMPeakRSS:
    """Peak resident memory of a process that builds the LM and trains it one step (asv peakmem)."""

    params = [MODELS, AUTOCAST]
    param_names = ["model", "autocast"]

    def setup(self, model, autocast):
        import torch

        from paracheck.bench.suites import model_for
        from paracheck.workloads.lm import TransformerLM

        self.spec = model_for(model)
        self.net = TransformerLM(self.spec)
        self.opt = torch.optim.AdamW(self.net.parameters(), lr=1e-4)
        self.x = torch.randint(self.spec.vocab_size, (4, self.spec.context_length))

    def peakmem_train_step(self, model, autocast):
        import torch
        import torch.nn.functional as F

        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = self.net(self.x)
        F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), self.x.reshape(-1)).backward()
        self.opt.step()
