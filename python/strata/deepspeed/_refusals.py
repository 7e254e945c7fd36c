"""A torch optimizer or lr scheduler built by the script cannot drive Strata's engine: the engine owns the
optimizer (its state sharded over the ranks, the update its own code) and applies the config's schedule. So
initialize(optimizer=..., lr_scheduler=...) is refused, and the message gives the config entry to write instead,
from the object's own settings where it is a torch.optim.AdamW / Adam / SGD."""
import json

import torch


def _optimizer_entry(opt):
    kinds = {torch.optim.AdamW: "AdamW", torch.optim.Adam: "Adam", torch.optim.SGD: "SGD"}
    kind = kinds.get(type(opt))
    if kind is None:
        return None
    d = opt.defaults
    keys = ("lr", "momentum", "weight_decay") if kind == "SGD" else ("lr", "betas", "eps", "weight_decay")
    params = {k: (list(d[k]) if isinstance(d[k], tuple) else d[k]) for k in keys if k in d}
    params = {k: (float(v) if isinstance(v, torch.Tensor) else v) for k, v in params.items()}
    return {"type": kind, "params": params}


def refuse_client_optimizer(optimizer):
    entry = _optimizer_entry(optimizer) if isinstance(optimizer, torch.optim.Optimizer) else None
    fix = (f"put it in the config instead: \"optimizer\": {json.dumps(entry)}" if entry is not None else
           "put an optimizer in the config instead (\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": ..., "
           "\"betas\": [...], \"eps\": ..., \"weight_decay\": ...}}; AdamW, Adam and SGD)")
    if entry is not None and len(optimizer.param_groups) > 1:
        fix += ", and pass its param groups as model_parameters"
    raise TypeError(f"strata.deepspeed.initialize: optimizer= ({type(optimizer).__name__}) is refused: Strata's "
                    f"engine runs the optimizer itself, its state sharded over the ranks, so a torch optimizer "
                    f"object would never be stepped; {fix}")


def refuse_client_scheduler(scheduler):
    raise TypeError(f"strata.deepspeed.initialize: lr_scheduler= ({type(scheduler).__name__}) is refused: the "
                    f"engine applies the lr schedule itself at every optimizer step; put it in the config instead "
                    f"(\"scheduler\": {{\"type\": \"WarmupLR\" | \"WarmupDecayLR\" | \"WarmupCosineLR\", \"params\": "
                    f"{{...}}}}, docs/configuration.md)")
