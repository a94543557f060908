"""Optimisers, gradient clipping, learning-rate schedules and loss scaling::

    opt = gdnflow.optim.Adam(model.parameters(), lr=1e-3)
    schedule = gdnflow.optim.CosineLR(opt, total_steps=10_000, warmup_steps=500)
    for batch in data:
        opt.zero_grad()
        loss = model.loss(batch)
        loss.backward()
        gdnflow.optim.clip_grad_norm(model.parameters(), 1.0)
        opt.step()
        schedule.step()

For float16 training, a :class:`~gdnflow.optim.DynamicLossScaler` scales the
loss and takes the step: ``scaler.scale(loss).backward()``, then
``scaler.step(opt)`` in place of ``opt.step()``.

Build the optimiser after ``model.to(device)``: moving a model creates new
Parameter objects (see :class:`~gdnflow.optim.optimizer.Optimizer`).
"""
from gdnflow.optim.adam import Adam
from gdnflow.optim.clip import clip_grad_norm
from gdnflow.optim.loss_scaling import DynamicLossScaler
from gdnflow.optim.optimizer import Optimizer
from gdnflow.optim.schedules import CosineLR, LRSchedule, StepLR
from gdnflow.optim.sgd import SGD

__all__ = ["Optimizer", "SGD", "Adam", "clip_grad_norm", "LRSchedule", "StepLR", "CosineLR",
           "DynamicLossScaler"]
