"""ctensor.optim: optimizers whose states follow their parameters' placement and SBP.

>>> opt = optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
>>> sched = optim.cosine_with_warmup(opt, warmup_steps=10, total_steps=200)
>>> loss.backward(); opt.step(); opt.zero_grad(); sched.step()
"""
from .optimizer import Optimizer
from .sgd import SGD
from .adam import Adam, AdamW
from .lr_scheduler import (LRScheduler, StepLR, ExponentialLR, LinearLR, CosineAnnealingLR,
                           LambdaLR, OneCycleLR, SequentialLR, cosine_with_warmup)
from .grad_scaler import GradScaler
from . import lr_scheduler

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "LRScheduler", "StepLR", "ExponentialLR",
           "LinearLR", "CosineAnnealingLR", "LambdaLR", "OneCycleLR", "SequentialLR",
           "cosine_with_warmup", "lr_scheduler", "GradScaler"]
