"""Run presets for the CLI: ``tiny`` (a 2-core CPU), ``paper-1.5b`` and ``paper-7b`` (a GPU mesh), per env and method;
the tree methods (RAO, SERA: :data:`TREE_METHODS`) have ``tiny`` and ``paper-4b`` (:func:`tiny_tree`,
:func:`paper_tree`).

``preset(name, method, env)`` returns a consistent :class:`~agentjax.train.runconfig.RunConfig`; the CLI applies
flag overrides on top, and experiment folders (``experiments/crbc/presets.py``) build theirs from these.

Paper setting (CRBC, papers/CRBC.txt; verl-agent's GiGPO recipe where it is silent): Qwen2.5-1.5B / 7B-Instruct,
16 groups × 8 rollouts per update, 150 updates, episode caps 50 / 15 / 15 turns (ALFWorld / WebShop / Sokoban;
TextCraft 40; TextCraft-Synth 75, TextWorld 100, TextWorld-Sync 200: the envs' own limits), success reward 10,
invalid-action penalty 0.1, 2 history records in the prompt, CRBC β = 0.98, w_G = 1, w_S = 5, σ_min = 0.1 (the
other methods: METHODS.md defaults; GiGPO's WebShop normalisation is ``mean_norm``), learning rate 1e-6, KL 0.01,
entropy 0.001, 512 response tokens, prompts of 2048 tokens (WebShop 4096, Sokoban 1024, TextCraft-Synth 8192:
measured, see :mod:`agentjax.train.runconfig`), evaluation on the whole eval split where it is small or the paper
uses all of it (:data:`PAPER_EVAL_TASKS`). The batch holds every turn (``16·8·cap`` rows), micro-batches of one row
per device (the mesh's fsdp size: 1.5B 8 rows, 7B 2).

Hardware the paper presets expect: one node of 8 GPUs with 80 GB each (A100 / H100 80GB). ``paper-1.5b`` shards
over ``mesh = (fsdp 8, tp 1)``, ``paper-7b`` over ``(fsdp 2, tp 4)``; float32 parameters and AdamW moments
(1.5B: ≈ 24 GB, 7B: ≈ 122 GB in total, split 8 ways), bfloat16 matmuls, rematerialised blocks. The mesh and
micro-batch are the ones whose compiled update fits 80 GB a device at every env's prompt capacity
(``experiments/bench/memory_plan.py``). They start from the Instruct weights: pass ``--model DIR`` (enforced by
``require_pretrained``).

The ``tiny`` preset: a 2-layer, d = 64 random-init Qwen2-architecture policy with the full Qwen vocabulary (151,936;
the real tokenizer), constrained decoding of ``<action>…</action>`` replies trained on the distribution it samples
(``masked_logp``; sparse: logits of the allowed tokens only), compact prompts (``prompt="compact"``,
:mod:`agentjax.agents.compact`: a short instruction, the observation last, one token per Sokoban cell, no history
where the state is fully observed), per-row sampling streams (``row_keys``: the same episodes whatever shares a
batch), 4 groups × 8 rollouts (Sokoban: 16 groups, :data:`TINY_GROUPS`), the paper's step caps (Sokoban 15; shorter
for TextCraft-Synth, TextWorld and TextWorld-Sync: :data:`TINY_STEP_CAPS`), prompt and reply capacities measured per
env (:data:`TINY_PROMPT_LENS`, :data:`TINY_RESPONSE_LENS`), updates of 4 mini-batches (micro-batches of 40 rows;
AdamW at 2e-3; Sokoban: two steps an update at 5e-4, :data:`TINY_LEARNING_RATES`), 10 updates (Sokoban 20) with
evaluation every 4 on 24 eval tasks × 2 seeds (Sokoban: 64 × 2 = 128 episodes, the same episodes and sampling
streams at every eval point). It starts from a shared supervised warm start on 1,000 oracle episodes (1,000 AdamW
steps of 32 turns at 2e-3, on the constrained choices: :mod:`agentjax.train.warmstart`, which records the policy's
held-out agreement with the oracle; Sokoban: 4,000 episodes and 2,000 steps, :data:`TINY_WARM_STARTS`). The RL step
was chosen on Sokoban only (:data:`TINY_LEARNING_RATES`; ``experiments/crbc/README.md``). Every env has an oracle, so
every tiny preset warm-starts, except the credit-testbed MDPs' (``--env mdp``): a word-level tokenizer and a 256-row
policy from random init, AdamW at 5e-3, on a pool of 4 s2 MDPs, 60 updates of 4 groups, evaluated every 10 with
the exact success and the batch's credit accuracy (:data:`TINY_WORD_ENVS`, :mod:`agentjax.train.exact`).
TextWorld's warm start plays all 300 train games, which are generated on first use (``$TEXTWORLD_GAMES``;
``python -m envs.textworld.generate --split train --split valid`` makes them ahead).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from agentjax.agents.compact import FULLY_OBSERVED
from agentjax.models.config import QwenConfig
from agentjax.models.sampler import SamplingParams
from agentjax.models.word_tokenizer import STOP_IDS as WORD_STOPS
from agentjax.rollout.collect import CollectConfig
from agentjax.rollout.policy import CHAT_STOP_IDS
from agentjax.train.config import (
    LossConfig,
    ModelConfig,
    OptimizerConfig,
    RAOCredit,
    RolloutConfig,
    SERACredit,
    TrainConfig,
    credit_for,
)
from agentjax.train.runconfig import (
    ENVS,
    WORDS_PREFIX,
    RunConfig,
    TreeConfig,
    WarmStart,
    full_capacity,
    sized_collect,
)
from agentjax.train.schedule import TOTAL_STEPS
from agentjax.train.tree_worlds import TREE_ENVS

PRESETS = ("tiny", "paper-1.5b", "paper-7b", "paper-4b")
TREE_METHODS = ("rao", "sera")  # methods that train recursive trees (agentjax.train.trees): tiny and paper-4b
# SERA in the tiny preset: 10 optimizer steps are two cycles of 3 execution, 1 decomposition and 1 rubric step (the
# paper's 16 : 2 : 2 over 250 steps would leave two stages out of 10), fork groups of 4 branches, 2 a tree.
TINY_SERA = dict(stages=(3, 1, 1), branches=4, fork_budget=8)
# SERA's rubric and grade lengths (new tokens): the tiny preset's constrained choices need <= 280 / 80.
TINY_RUBRIC_TOKENS, PAPER_RUBRIC_TOKENS = (320, 96), (1024, 512)
STEP_CAPS = {"alfworld": 50, "webshop": 15, "sokoban": 15, "textcraft": 40, "textcraft_synth": 75, "textworld": 100,
             "textworld_sync": 200, "mdp": 14}
# The tiny preset's caps: the paper's, shorter where the paper's would make a 2-core CPU update take hours (the
# oracle's episodes: TextCraft-Synth medium ≤ 48 turns in 30 sampled tasks, TextWorld median 15, TextWorld-Sync's
# train split ≤ 60, medium ≤ 48; longer ones are cut).
# Multiples of 5, so that the 4 x 8 x cap rows split into 4 mini-batches of 40.
TINY_STEP_CAPS = STEP_CAPS | {"textcraft_synth": 40, "textworld": 40, "textworld_sync": 50}
# Prompt capacities of the tiny preset (constrained decoding: the admissible list is in the prompt), measured with the
# real tokenizer on the warm start's demonstrations (its 1,000 oracle episodes, or the whole split, cut at the cap):
# TextCraft ≤ 3,631 tokens, TextCraft-Synth ≤ 3,907, TextWorld ≤ 961 (31 games; ≤ 967 over oracle and random episodes
# of 42 games, agentjax/train/runconfig.py), TextWorld-Sync ≤ 1,121 (oracle and random episodes of 152 tasks of its
# three splits, runconfig.py).
TINY_PROMPT_LENS = {"sokoban": 128, "alfworld": 2048, "webshop": 2048, "textcraft": 4096, "textcraft_synth": 4096,
                    "textworld": 1536, "textworld_sync": 1536, "mdp": 48}
# Response capacities: the longest constrained reply (<action>…</action> and the stop token) with room to spare:
# TextCraft-Synth 59 tokens on train_medium, 105 on val; TextWorld 14, TextWorld-Sync 13; WebShop's listed search
# (the instruction, TINY_ENV_KWARGS) up to 75 over all 6,910 goals.
TINY_RESPONSE_LENS = {"sokoban": 10, "alfworld": 48, "webshop": 96, "textcraft": 48, "textcraft_synth": 128,
                      "textworld": 32, "textworld_sync": 32, "mdp": 8}
# Sokoban's compact prompt (agentjax.agents.compact: one token per cell, no history) is 98-112 tokens.
# Sizes of the tiny preset where they differ from 4 groups, 10 updates, 24 eval tasks: Sokoban trains on 16 rooms a
# batch (8 rooms an update moved the policy in no consistent direction) and evaluates on 64 valid rooms x 2 seeds =
# 128 episodes.
TINY_GROUPS = {"sokoban": 16, "mdp": 4}
TINY_UPDATES = {"sokoban": 20, "mdp": 60}
# RL step of the tiny preset (AdamW learning rate, optimizer steps per update) where it differs from 2e-3 and 4:
# Sokoban's, chosen from its warm start with GRPO / GiGPO among five steps (experiments/crbc/probe.py and
# experiments/crbc/README.md): the largest that moved eval success beyond noise on 16 rooms an update.
TINY_LEARNING_RATES = {"sokoban": 5e-4, "mdp": 5e-3}
TINY_MINI_BATCHES = {"sokoban": 2}
TINY_EVAL_TASKS = {"sokoban": 64}
# Warm starts of the tiny preset where they differ from 1,000 oracle episodes and 1,000 steps: Sokoban's loss stalls
# on 1,000 episodes and keeps falling on 4,000 (experiments/crbc/warmstart_curve.py; experiments/crbc/README.md).
TINY_WARM_STARTS = {"sokoban": dict(episodes=4000, steps=2000)}
# Env keyword arguments of the tiny preset: TextCraft lists admissible commands only when asked (the constrained
# decoder and the warm start's masked choices need the list).
# WebShop: the constrained policy cannot write a query, so its listed search is the instruction (envs/webshop/env.py).
TINY_ENV_KWARGS = {"textcraft": {"admissible": True}, "textcraft_synth": {"admissible": True},
                   "webshop": {"search_query": "instruction"}, "mdp": {"setting": "s2"}}
# Collector overrides of the tiny preset: TextCraft's listings grow with the recipe tree (TextCraft-Synth's val
# extreme tasks open with prompts of up to 31,104 tokens): longer prompts keep their last tokens.
# WebShop: up to 56 listed actions on an item page of the 1k catalogue, so up to 56 allowed tokens at a position.
TINY_COLLECT = {"textcraft": {"truncation": "left"}, "textcraft_synth": {"truncation": "left"},
                "webshop": {"max_allowed": 64}}
# Paper evaluation: ALFWorld's 134 valid_unseen games, the whole eval split where it is smaller than 128 or where the
# paper evaluates on all of it (TextCraft-Synth: SERA's 632 val tasks; TextWorld-Sync: SERA's 1,400 test tasks).
PAPER_EVAL_TASKS = {"alfworld": 134, "webshop": 128, "sokoban": 128, "textcraft": 100, "textcraft_synth": 632,
                    "textworld": 60, "textworld_sync": 1400, "mdp": 128}
# The tiny preset of the envs with a word vocabulary (the credit-testbed MDPs, envs/mdp): a word-level tokenizer
# ("words:<env>", agentjax.train.tokenizers: 235 tokens for mdp), a policy with 256 vocabulary rows
# (tiny_word_arch), random init (no warm start: what it learns, the RL signal taught it), AdamW at 5e-3, micro-batches
# of TINY_WORD_MICRO_BATCH rows (4 x 8 x 14 = 448 rows: 4 mini-batches of 2 micro-batches of 56), s2 (the
# pre-registered setting with converging paths and slips). An MDP's room numbers and labels carry nothing that another
# MDP shares (envs/mdp/text.py), so a policy learns each MDP's table and cannot generalise to unseen seeds: the run
# trains on a pool of the first 4 train MDPs (one group each per batch) and evaluates on them (TINY_WORD_RUN:
# RunConfig.train_pool, eval_split; the tiny CRBC experiment's pool setting), 16 sampled episodes each every 10
# updates, with the exact success and the batch's credit accuracy (agentjax.train.exact). The sizes are chosen so a
# run takes minutes on a laptop CPU.
TINY_WORD_ENVS = frozenset({"mdp"})
TINY_WORD_MICRO_BATCH = 56
TINY_WORD_RUN = dict(train_pool=4, eval_split="train", eval_tasks=4, eval_seeds=16, eval_every=10, checkpoint_every=20)


def paper_credit(method: str, env: str, **params: Any):
    """The credit config of ``method`` in the paper's setting (CRBC: β 0.98, w_G 1, w_S 5, σ_min 0.1)."""
    defaults: dict[str, Any] = {}
    if method == "crbc":
        defaults = dict(beta=0.98, w_traj=1.0, w_step=5.0, sigma_min=0.1)
    elif method == "gigpo" and env == "webshop":
        defaults = dict(mode="mean_norm")
    return credit_for(method, **(defaults | params))


def tiny_arch(**kw: Any) -> QwenConfig:
    """The tiny preset's policy: Qwen2 structure, the full Qwen2.5 vocabulary, 2 layers of width 64."""
    return QwenConfig.tiny_qwen2(**(dict(vocab_size=151_936, d_model=64, mlp_dim=256, num_layers=2, num_heads=4,
                                          num_kv_heads=2, head_dim=16, name="tiny-qwen2-151k") | kw))


def tiny_word_arch(**kw: Any) -> QwenConfig:
    """The policy of the word-vocabulary envs' tiny preset: Qwen2 structure, 256 vocabulary rows, 2 layers of width
    64."""
    return QwenConfig.tiny_qwen2(**(dict(vocab_size=256, d_model=64, mlp_dim=128, num_layers=2, num_heads=4,
                                          num_kv_heads=2, head_dim=16, max_positions=512, name="tiny-qwen2-words")
                                    | kw))


def _sized(train: TrainConfig, collect: CollectConfig, *, num_groups: int, group_size: int, max_steps: int,
           prompt_len: int, response_len: int, micro_batch_size: int | None = None) -> dict[str, Any]:
    """``train`` with the run's sizes (every turn of every rollout fits the batch) and, if given, the micro-batch size
    that splits it; ``collect`` with the same sizes (:func:`~agentjax.train.runconfig.sized_collect`)."""
    ro = RolloutConfig(num_groups=num_groups, group_size=group_size, max_steps=max_steps, prompt_len=prompt_len,
                       response_len=response_len, capacity=num_groups * group_size * max_steps)
    micro = dict(micro_batch_size=micro_batch_size) if micro_batch_size is not None else {}
    return dict(train=train.replace(rollout=ro, **micro), collect=sized_collect(collect, ro))


def tiny(method: str, env: str = "sokoban", **credit: Any) -> RunConfig:
    """The CPU preset (module docstring; the word-vocabulary envs: :data:`TINY_WORD_ENVS`)."""
    spec = ENVS[env]
    prompt_len, response_len = TINY_PROMPT_LENS[env], TINY_RESPONSE_LENS[env]
    words = env in TINY_WORD_ENVS
    train = TrainConfig(
        model=ModelConfig(tiny_word_arch() if words else tiny_arch()),
        credit=paper_credit(method, env, **credit),
        loss=LossConfig(logprob_chunk=16, logprob_remat=False),
        optimizer=OptimizerConfig(learning_rate=TINY_LEARNING_RATES.get(env, 2e-3)),
        micro_batch_size=40,
        mini_batches=TINY_MINI_BATCHES.get(env, 4),
        seed=0,
    )
    collect = spec.collect(constrained=True, masked_logp=True, prompt="compact",
                           history_length=0 if env in FULLY_OBSERVED else 2, batch_bucket=8, pow2_batches=True,
                           row_keys=True, sparse_logits=True,
                           sampling=SamplingParams(temperature=1.0, max_new_tokens=response_len,
                                                   stop_token_ids=WORD_STOPS if words else CHAT_STOP_IDS,
                                                   prompt_bucket=prompt_len), **TINY_COLLECT.get(env, {}))
    groups = TINY_GROUPS.get(env, 4)
    sizes = _sized(train, collect, num_groups=groups, group_size=8, max_steps=TINY_STEP_CAPS[env],
                   prompt_len=prompt_len, response_len=response_len,
                   micro_batch_size=TINY_WORD_MICRO_BATCH if words else None)
    run = RunConfig(**sizes, env=env, env_kwargs=dict(TINY_ENV_KWARGS.get(env, {})), updates=TINY_UPDATES.get(env, 10),
                    eval_every=4, eval_tasks=TINY_EVAL_TASKS.get(env, 24), eval_seeds=2, checkpoint_every=4,
                    keep_checkpoints=2, out_dir=f"runs/tiny-{env}-{method}",
                    warm_start=WarmStart(**(dict(episodes=1000, steps=1000, batch_size=32, learning_rate=2e-3)
                                            | TINY_WARM_STARTS.get(env, {}))))
    if words:
        return env_step_cap(run.replace(tokenizer=f"{WORDS_PREFIX}{env}", warm_start=None, **TINY_WORD_RUN))
    return run


def env_step_cap(run: RunConfig) -> RunConfig:
    """``run`` with its episode cap the env's own where the env's keyword arguments choose it (the mdp settings:
    ``MDPEnv(**env_kwargs).max_steps``, s1 34, s2 14, s3 20); other envs unchanged. The batch grows or shrinks with
    it (every turn fits) and keeps its micro-batches per mini-batch where they divide the new batch (the tiny mdp
    preset: 4 mini-batches of 2 micro-batches), else the micro-batch size becomes a divisor of the new mini-batch."""
    if run.env != "mdp" or run.tree is not None:
        return run
    cap = run.spec.env_class()(**run.env_kwargs).max_steps
    if cap == run.collect.max_steps:
        return run
    ro, mini, micro = run.train.rollout, run.train.mini_batches, run.train.micro_batch_size
    per_mini = max(ro.rows // (mini * micro), 1)
    rows = full_capacity(dataclasses.replace(ro, max_steps=cap), run.tree)
    if rows % (mini * per_mini):
        mini = math.gcd(rows, mini)
        per_mini = 1
    new_micro = rows // (mini * per_mini)
    return run.replace(train=run.train.replace(mini_batches=mini)).with_sizes(max_steps=cap,
                                                                               micro_batch_size=new_micro)


def paper(method: str, env: str, size: str = "1.5b", **credit: Any) -> RunConfig:
    """The paper's setting for ``env`` with Qwen2.5-``size``-Instruct (module docstring)."""
    if size not in ("1.5b", "7b"):
        raise ValueError(f"paper presets come in sizes '1.5b' and '7b', not {size!r}")
    spec = ENVS[env]
    arch = (QwenConfig.qwen2p5_1p5b if size == "1.5b" else QwenConfig.qwen2p5_7b)(dtype="bfloat16", remat=True)
    cap = STEP_CAPS[env]
    prompt_len = spec.collect().max_prompt_tokens
    train = TrainConfig(
        model=ModelConfig(arch),
        credit=paper_credit(method, env, **credit),
        loss=LossConfig(),  # ε 0.2, dual clip 3, KL 0.01, entropy 0.001, token-mean (verl-agent)
        optimizer=OptimizerConfig(learning_rate=1e-6),
        micro_batch_size=8 if size == "1.5b" else 2,  # one row per device (module docstring)
        seed=0,
    )
    collect = spec.collect(history_length=2, invalid_penalty=0.1, success_reward=10.0, reward="success",
                           truncation="left", batch_bucket=64,
                           sampling=SamplingParams(temperature=1.0, max_new_tokens=512, stop_token_ids=CHAT_STOP_IDS,
                                                   prompt_bucket=256))
    sizes = _sized(train, collect, num_groups=16, group_size=8, max_steps=cap, prompt_len=prompt_len, response_len=512)
    return RunConfig(**sizes, env=env, updates=150, eval_every=10,
        eval_tasks=PAPER_EVAL_TASKS[env], eval_seeds=3, checkpoint_every=10,
        keep_checkpoints=3, out_dir=f"runs/paper-{size}-{env}-{method}", workers=16,
        mesh=(8, 1) if size == "1.5b" else (2, 4), require_pretrained=True, progress=True)


# -- RAO: recursive trees (METHODS.md "SERA" 1, 6-8; agentjax.train.trees) -----------------------------------------
# The released optimizer (Training/configs/textcraft.yaml, textworld.yaml): Adam(W) lr 3e-6, betas (0.9, 0.95),
# eps 1e-8, weight decay 0.017, gradient clipping 1.0, constant schedule; warm-up 0.001 of the steps (0 steps of 250
# or 400); one optimizer step per batch; CISPO clipped to [0, 5], no KL. Sampling at temperature 1, replies of up to
# 512 (TextCraft-Synth) / 3,072 (TextWorld-Sync) tokens, prompts of 9,600 / 10,240; the zero-variance filter on
# TextCraft-Synth only.
RELEASED_ADAM = dict(b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.017, max_grad_norm=1.0, schedule="constant")
PAPER_TREE_LENS = {"textcraft_synth": (9600, 512), "textworld_sync": (10240, 3072)}  # prompt, response tokens
FILTER_ZERO_VARIANCE = {"textcraft_synth": True, "textworld_sync": False}
# TextWorld-Sync trains with the released runtime's shared budget of 100 steps and evaluates with each task's own
# (agentjax.agents.textworld_tree.TextWorldTreeConfig.training / .evaluation).
TREE_ENV_KWARGS = {"textcraft_synth": {}, "textworld_sync": {"budget": 100, "lookup_style": "training"}}
TREE_EVAL_ENV_KWARGS = {"textcraft_synth": None, "textworld_sync": {"budget": None, "lookup_style": "evaluation"}}
# The tiny preset's tree worlds: TextCraft-Synth without the recipe listing in a node's first message (prompts
# of 521 tokens median, <= 1,189 on 40 train_medium planner trees with history 2; with it: up to 1,989) and with the
# planner tree's reply among the admissible ones (the warm start imitates planner trees under the constraint).
TINY_TREE_ENV_KWARGS = {"textcraft_synth": {"show_recipes": False, "planner_replies": True},
                        "textworld_sync": {"budget": 100, "lookup_style": "training"}}
# Prompt / reply capacities of the tiny tree preset: TextCraft-Synth planner replies <= 162 tokens at 8 turns a node
# (crafts packed to fit the budget), prompts as above; TextWorld-Sync replies are one command or a delegation.
TINY_TREE_LENS = {"textcraft_synth": (1536, 192), "textworld_sync": (2048, 96)}
# Turns per node and the collector's turn cap of the tiny tree preset: TextCraft-Synth's planner trees fit 8 turns a
# node (every one of 200 train_medium tasks at depth <= 2); TextWorld-Sync's need the paper's 20 (planner trees on 24
# train tasks: root success 0.21 at 8 turns a node, 1.0 at 20; replies <= 63 tokens, prompts <= 1,639).
TINY_TREE_STEPS = {"textcraft_synth": (8, 48), "textworld_sync": (20, 96)}


def tiny_tree_arch(**kw: Any) -> QwenConfig:
    """The tiny tree preset's policy: Qwen3 structure (q/k norm, no bias), the full Qwen vocabulary, 2 layers of
    width 64."""
    return QwenConfig.tiny_qwen3(**(dict(vocab_size=151_936, d_model=64, mlp_dim=256, num_layers=2, num_heads=4,
                                          num_kv_heads=2, head_dim=16, max_positions=4096, name="tiny-qwen3-151k")
                                    | kw))


def _tree_sized(train: TrainConfig, collect: CollectConfig, tree: TreeConfig, **sizes: int) -> dict[str, Any]:
    """``_sized`` with the tree batch's row bound (:func:`~agentjax.train.runconfig.full_capacity`: every turn of every
    node fits)."""
    out = _sized(train, collect, **sizes)
    ro = dataclasses.replace(out["train"].rollout, capacity=full_capacity(out["train"].rollout, tree))
    return dict(train=out["train"].replace(rollout=ro), collect=sized_collect(out["collect"], ro))


def _tree_credit(method: str, env: str, credit: dict[str, Any], tiny: bool) -> RAOCredit:
    """RAO's or SERA's credit with the env's released zero-variance filter (and the tiny SERA cycle)."""
    defaults = dict(filter_zero_variance=FILTER_ZERO_VARIANCE[env])
    if method == "sera":
        return SERACredit(**(defaults | (TINY_SERA if tiny else {}) | credit))
    return RAOCredit(**(defaults | credit))


def tiny_tree(method: str = "rao", env: str = "textcraft_synth", **credit: Any) -> RunConfig:
    """The tree methods' CPU preset: 2 root tasks × 4 trees per batch, 8 turns a node (TextWorld-Sync: 20,
    :data:`TINY_TREE_STEPS`), depth <= 2, <= 16 nodes a tree, a 2-layer Qwen3 (:func:`tiny_tree_arch`) with
    constrained decoding over the world's admissible replies, history 2, one CISPO step a batch (Adam with the
    released betas, decay and clipping at a tiny-model learning rate of 1e-3), 10 optimizer steps, evaluation every
    5 on 8 eval tasks × 2 trees; warm start: 300 AdamW steps of 16 node turns at 2e-3 on 128 planner trees
    (:mod:`agentjax.train.tree_warmstart`; ~3,800 node turns). Cost on the shared 2-core machine (load 5-8): an
    update of ~50-100 node turns takes 15-30 s to grow its trees and 30-40 s to train (most of it compiling a new
    batch shape), a warm-start step ~7 s (node prompts of 500-1,200 tokens)."""
    if method not in TREE_METHODS:
        raise ValueError(f"tiny_tree: {method!r} is not a tree method ({', '.join(TREE_METHODS)})")
    prompt_len, response_len = TINY_TREE_LENS[env]
    train = TrainConfig(
        model=ModelConfig(tiny_tree_arch()),
        credit=_tree_credit(method, env, credit, tiny=True),
        loss=LossConfig(kl_coef=0.0, entropy_coef=0.0, logprob_chunk=16, logprob_remat=False),
        optimizer=OptimizerConfig(learning_rate=1e-3, **RELEASED_ADAM),
        micro_batch_size=16, seed=0)
    collect = CollectConfig(constrained=True, masked_logp=True, sparse_logits=True, max_allowed=32, batch_bucket=8,
                            pow2_batches=True, row_keys=True, truncation="left",
                            sampling=SamplingParams(temperature=1.0, max_new_tokens=response_len,
                                                    stop_token_ids=CHAT_STOP_IDS, prompt_bucket=512))
    max_steps, max_turns = TINY_TREE_STEPS[env]
    tree = TreeConfig(max_depth=2, max_children=4, max_nodes=16, max_turns=max_turns, history_length=2,
                      rubric_tokens=TINY_RUBRIC_TOKENS[0], grade_tokens=TINY_RUBRIC_TOKENS[1], rubric_choices=True)
    sizes = _tree_sized(train, collect, tree, num_groups=2, group_size=4, max_steps=max_steps, prompt_len=prompt_len,
                        response_len=response_len)
    return RunConfig(**sizes, env=env, env_kwargs=dict(TINY_TREE_ENV_KWARGS[env]),
                     eval_env_kwargs=TREE_EVAL_ENV_KWARGS[env], updates=10, eval_every=5, eval_tasks=8, eval_seeds=2,
                     checkpoint_every=5, keep_checkpoints=2, out_dir=f"runs/tiny-{env}-{method}",
                     warm_start=WarmStart(episodes=128, steps=300, batch_size=16, learning_rate=2e-3), tree=tree)


def paper_tree(method: str = "rao", env: str = "textcraft_synth", **credit: Any) -> RunConfig:
    """SERA's setting for a tree method (papers/SERA.txt; the released configs): Qwen3-4B-Instruct-2507, 8 root
    tasks × 8 trees per step, 20 turns per node, depth <= 3, the released optimizer (:data:`RELEASED_ADAM`, lr 3e-6)
    and sampling, 250 (TextCraft-Synth) / 400 (TextWorld-Sync) optimizer steps, every node's whole history in its
    prompt, evaluation on SERA's whole eval split (one tree per task) every 50 steps, on an (fsdp 1, tp 8) mesh of
    one 8-GPU node with micro-batches of one row: every weight matrix split 8 ways (no FSDP gathers), each row's
    activations split over the heads and the MLP width (rows of up to 13,312 tokens; the compiled update fits 80 GB a
    device: ``experiments/bench/memory_plan.py``). It starts from the Instruct weights (``--model DIR``)."""
    if method not in TREE_METHODS:
        raise ValueError(f"paper_tree: {method!r} is not a tree method ({', '.join(TREE_METHODS)})")
    prompt_len, response_len = PAPER_TREE_LENS[env]
    train = TrainConfig(
        model=ModelConfig(QwenConfig.qwen3_4b(dtype="bfloat16", remat=True)),
        credit=_tree_credit(method, env, credit, tiny=False),
        loss=LossConfig(kl_coef=0.0, entropy_coef=0.0),
        optimizer=OptimizerConfig(learning_rate=3e-6, **RELEASED_ADAM),
        micro_batch_size=1, seed=0)
    collect = CollectConfig(truncation="left", batch_bucket=64, invalid_penalty=0.1, success_reward=10.0,
                            sampling=SamplingParams(temperature=1.0, max_new_tokens=response_len,
                                                    stop_token_ids=CHAT_STOP_IDS, prompt_bucket=256))
    tree = TreeConfig(max_depth=3, max_children=8, max_nodes=64, max_turns=400, rubric_tokens=PAPER_RUBRIC_TOKENS[0],
                      grade_tokens=PAPER_RUBRIC_TOKENS[1])
    sizes = _tree_sized(train, collect, tree, num_groups=8, group_size=8, max_steps=20, prompt_len=prompt_len,
                        response_len=response_len)
    return RunConfig(**sizes, env=env, env_kwargs=dict(TREE_ENV_KWARGS[env]), eval_env_kwargs=TREE_EVAL_ENV_KWARGS[env],
                     updates=TOTAL_STEPS[env], eval_every=50, eval_tasks=PAPER_EVAL_TASKS[env], eval_seeds=1,
                     checkpoint_every=50, keep_checkpoints=3, out_dir=f"runs/paper-4b-{env}-{method}", mesh=(1, 8),
                     require_pretrained=True, tree=tree)


def preset(name: str, method: str, env: str, **credit: Any) -> RunConfig:
    """A preset by name (:data:`PRESETS`), with clear errors for unknown names: the tree methods
    (:data:`TREE_METHODS`) have ``tiny`` and ``paper-4b``, the flat ones ``tiny``, ``paper-1.5b`` and ``paper-7b``."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {PRESETS}")
    if env not in ENVS:
        raise ValueError(f"unknown env {env!r}; choose one of {sorted(ENVS)}")
    if method in TREE_METHODS:
        if env not in TREE_ENVS:
            raise ValueError(f"--method {method} trains recursive agents on {', '.join(TREE_ENVS)}, not {env!r}")
        if name == "tiny":
            return tiny_tree(method, env, **credit)
        if name != "paper-4b":
            raise ValueError(f"--method {method}'s paper preset is paper-4b (Qwen3-4B-Instruct-2507), not {name!r}")
        return paper_tree(method, env, **credit)
    if name == "paper-4b":
        raise ValueError(f"paper-4b is the tree methods' preset ({', '.join(TREE_METHODS)}); --method {method} has "
                         "paper-1.5b and paper-7b")
    if name == "tiny":
        return tiny(method, env, **credit)
    return paper(method, env, name.removeprefix("paper-"), **credit)
