"""Training: config, state, advantages, the jitted update, checkpoints and metrics (the loop composes them).

A trainer loop uses them as::

    tx = make_optimizer(config.optimizer)
    state = init_state(config, model, key, tx)
    update = make_update(config, model, tx)
    ...
    adv = compute_advantages(config.credit, batch, config.rollout)     # PPO: values=value_fn(state, batch)
    state, key = next_key(state)
    state, metrics = update(state, UpdateBatch.of(batch, adv), key)   # SERO: UpdateBatch.of(batch, adv, oracle)
    check_nonfinite(state, metrics, config)
    checkpoints.save(state)                    # on --resume: restore_latest(abstract_state(config, model, tx))
"""

from agentjax.train.advantages import Advantages, check_batch_fits, compute_advantages
from agentjax.train.checkpoint import Checkpointer, CheckpointError, CorruptCheckpointWarning, Restored, fingerprint
from agentjax.train.config import (
    CREDIT_METHODS,
    CRBCCredit,
    CreditConfig,
    GiGPOCredit,
    GraphGPOCredit,
    GRPOCredit,
    HGPOCredit,
    LossConfig,
    ModelConfig,
    OptimizerConfig,
    PPOCredit,
    RAOCredit,
    RLOOCredit,
    RolloutConfig,
    SERACredit,
    TrainConfig,
    credit_for,
)
from agentjax.train.metrics import (
    MetricsWriter,
    ProgressBar,
    StageTimer,
    read_metrics,
    rollout_metrics,
    to_floats,
    update_metrics,
)
from agentjax.train.schedule import STAGES, ScheduleState, StageSchedule, init_schedule, stage_at, stage_name
from agentjax.train.state import (
    TrainState,
    abstract_state,
    init_state,
    init_value_head,
    make_optimizer,
    make_schedule,
    next_key,
    policy_params,
    sync_model,
)
from agentjax.train.update import (
    NonFiniteUpdateError,
    UpdateBatch,
    UpdateSpec,
    check_nonfinite,
    make_grad_fn,
    make_logprob_fn,
    make_loss_fn,
    make_update,
    make_value_fn,
    skip_batch,
)

__all__ = [
    "CREDIT_METHODS",
    "STAGES",
    "Advantages",
    "CRBCCredit",
    "CheckpointError",
    "Checkpointer",
    "CorruptCheckpointWarning",
    "CreditConfig",
    "GRPOCredit",
    "GiGPOCredit",
    "GraphGPOCredit",
    "HGPOCredit",
    "LossConfig",
    "MetricsWriter",
    "ModelConfig",
    "NonFiniteUpdateError",
    "OptimizerConfig",
    "PPOCredit",
    "ProgressBar",
    "RAOCredit",
    "SERACredit",
    "RLOOCredit",
    "Restored",
    "RolloutConfig",
    "ScheduleState",
    "StageSchedule",
    "StageTimer",
    "TrainConfig",
    "TrainState",
    "UpdateBatch",
    "UpdateSpec",
    "abstract_state",
    "check_batch_fits",
    "check_nonfinite",
    "compute_advantages",
    "credit_for",
    "fingerprint",
    "init_schedule",
    "init_state",
    "init_value_head",
    "make_grad_fn",
    "make_logprob_fn",
    "make_loss_fn",
    "make_optimizer",
    "make_schedule",
    "make_update",
    "make_value_fn",
    "next_key",
    "policy_params",
    "read_metrics",
    "rollout_metrics",
    "skip_batch",
    "stage_at",
    "stage_name",
    "sync_model",
    "to_floats",
    "update_metrics",
]

# The trainer, its algorithms, its run config and presets.
from agentjax.train.algorithm import Algorithm, Evaluation  # noqa: E402
from agentjax.train.eval import eval_key, evaluate  # noqa: E402
from agentjax.train.flat import FlatAlgorithm  # noqa: E402
from agentjax.train.offline import build_bank, evaluate_checkpoint, find_run, saved_run  # noqa: E402
from agentjax.train.presets import PRESETS, preset  # noqa: E402
from agentjax.train.runconfig import ENVS, EnvSpec, RunConfig, TreeConfig, WarmStart, run_from_dict  # noqa: E402
from agentjax.train.trainer import Trainer, setup, task_stream, train  # noqa: E402
from agentjax.train.trees import (  # noqa: E402
    NoSignalError,
    TreeAlgorithm,
    batch_capacity,
    evaluate_trees,
    load_trees,
    save_trees,
    saved_tree_files,
)

__all__ += [
    "ENVS",
    "PRESETS",
    "Algorithm",
    "EnvSpec",
    "Evaluation",
    "FlatAlgorithm",
    "NoSignalError",
    "RunConfig",
    "Trainer",
    "TreeAlgorithm",
    "TreeConfig",
    "WarmStart",
    "batch_capacity",
    "build_bank",
    "eval_key",
    "evaluate",
    "evaluate_checkpoint",
    "evaluate_trees",
    "find_run",
    "load_trees",
    "preset",
    "run_from_dict",
    "save_trees",
    "saved_run",
    "saved_tree_files",
    "setup",
    "task_stream",
    "train",
]
