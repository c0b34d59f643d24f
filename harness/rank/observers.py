"""The one installer of the rank-side observers: what every launched rank records about its
run, under the dump folder (harness/registry/dump_layout.py), observing only (a run's losses and grad
norms are bitwise those of the same run without them).

The launcher names the observers in ``HARNESS_OBSERVERS`` on every rank (harness/launch/run.py
``rank_environment``: all of them, on every device, trn2 included) and puts the boot folder
(harness/rank/boot) first on the ranks' path; the boot ``sitecustomize`` calls
``install_from_env``, which patches ``torchtitan.trainer.Trainer`` once, right after torchtitan
imports it, after the shims and plants (so its wrappers are the outermost). A registered
backend's config and a user's subject config get them alike: config functions stay pure (they
build and return a ``Trainer.Config``, nothing else).

The observers, by the name ``HARNESS_OBSERVERS`` gives them:
- ``step0_weights``: a random-init run's step-0 weights, right after the trainer built and
  initialised them (harness/rank/step0.py ``dump_initial``);
- ``shard_fingerprints``: at step 1, before the batch reaches the model, every rank's
  fingerprints of its local shards (``write_fingerprints``);
- ``batches``: every rank's batch of each of the first ``HARNESS_DUMP_STEPS`` steps (default
  1), as the dataloader gave it and as the model is fed (``dump_batch``);
- ``trainer_state``: tying and ``expert_bias`` state after build, after the checkpoint load at
  the start of ``train``, and after training (harness/rank/hooks.py ``record_state``);
- ``load_balance``: MoE models, per optimizer step, what load balancing saw and did
  (``record_balance``);
- ``resumed_state``: a resumed run (its load restored a step), every model and optimizer
  tensor the trainer holds once the load returned (``record_resumed_state``);
- ``first_step_grads``: every parameter's gradient of the first trained step, after its last
  microbatch's backward and before clipping (``record_first_step_grads``).
"""

from __future__ import annotations

import os

from harness.rank import step0 as rank_step0
from harness.registry import environment
from harness.upstream.install import after_import

OBSERVERS = ("step0_weights", "shard_fingerprints", "batches", "trainer_state", "load_balance",
             "resumed_state", "first_step_grads")


def checked(names) -> tuple[str, ...]:
    """``names`` if each is an observer; otherwise a clear error."""
    names = tuple(names)
    unknown = [n for n in names if n not in OBSERVERS]
    if unknown:
        raise ValueError(f"unknown rank observer(s) {unknown} in {environment.OBSERVERS}; "
                         f"known: {', '.join(OBSERVERS)}")
    return names


def env_value(names=OBSERVERS) -> str:
    """``HARNESS_OBSERVERS`` for a rank that records ``names``."""
    return ",".join(checked(names))


def install_from_env() -> None:
    """In a launched rank (the boot ``sitecustomize``): the observers ``HARNESS_OBSERVERS``
    names, installed as torchtitan's trainer is imported."""
    names = checked(environment.names(os.environ.get(environment.OBSERVERS)))
    if names:
        after_import("torchtitan.trainer", lambda module: install(module, names))


def install(trainer_module, names=OBSERVERS) -> None:
    """Patch ``trainer_module.Trainer`` once: ``names`` observe each trainer it builds."""
    on = frozenset(checked(names))
    dump_steps = int(os.environ.get(environment.DUMP_STEPS, "1"))
    cls = trainer_module.Trainer
    original_init, original_train = cls.__init__, cls.train

    def __init__(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        observe_built(self, on, dump_steps)

    def train(self, *args, **kwargs):
        result = original_train(self, *args, **kwargs)
        if "trainer_state" in on:
            _rank_hooks().record_state(self, "trained")
        return result

    cls.__init__ = __init__
    cls.train = train


def observe_built(trainer, on: frozenset, dump_steps: int) -> None:
    """Right after the trainer is built: what it records now, and its wrappers for later."""
    if "step0_weights" in on and not getattr(trainer.config.checkpoint, "initial_load_path", None):
        rank_step0.dump_initial(trainer)
    observe_batches(trainer, on, dump_steps)
    if "trainer_state" in on:
        _rank_hooks().record_state(trainer, "built")
    if on & {"trainer_state", "resumed_state"}:
        record_after_load(trainer, on)
    if "load_balance" in on:
        _rank_hooks().record_balance(trainer)
    if "first_step_grads" in on:
        _rank_hooks().record_first_step_grads(trainer)


def observe_batches(trainer, on: frozenset, dump_steps: int) -> None:
    """Outermost, per instance: sees the dataloader's batch before any class-level patch
    (upstream shims, plants) rewrites it, and what comes out (what the model is fed)."""
    post = trainer.post_dataloading_process
    fingerprinted = False

    def post_dataloading_process(input_dict, labels, *args, **kwargs):
        nonlocal fingerprinted
        if "shard_fingerprints" in on and trainer.step == 1 and not fingerprinted:
            fingerprinted = True  # once, whatever the microbatches
            rank_step0.write_fingerprints(trainer)
        processed = post(input_dict, labels, *args, **kwargs)
        if "batches" in on and trainer.step <= dump_steps:
            rank_step0.dump_batch(trainer, input_dict, labels, processed)
        return processed

    trainer.post_dataloading_process = post_dataloading_process


def record_after_load(trainer, on: frozenset = frozenset({"trainer_state"})) -> None:
    """Right after the checkpoint load at the start of ``train``: the ``loaded`` state, and
    where the load restored a step (a resume), every tensor the trainer holds."""
    load = trainer.checkpointer.load

    def load_then_record(*args, **kwargs):
        loaded = load(*args, **kwargs)
        if "trainer_state" in on:
            _rank_hooks().record_state(trainer, "loaded")
        if "resumed_state" in on and loaded and int(trainer.step) > 0:
            _rank_hooks().record_resumed_state(trainer)
        return loaded

    trainer.checkpointer.load = load_then_record


def _rank_hooks():
    # Imported once the trainer is: it imports torch, which the boot must not (the shims'
    # post-import hooks are registered first).
    from harness.rank import hooks as rank_hooks  # noqa: PLC0415  order: imports torch, after the shims' post-import hooks

    return rank_hooks
