"""The trainer learns: from random init, through the real loop, on two tasks written for it.

Every run is :func:`agentjax.train.trainer.train` itself: collect (a :class:`~agentjax.models.Sampler` over a 1-layer
random-init Qwen2, constrained decoding over the admissible actions with the log-probs renormalised over the
constrained choices, as the ``tiny`` preset) → ``compute_advantages`` → ``make_update`` (the ``tiny`` preset's loss;
AdamW at the test's own learning rate 1e-3, 4 mini-batches per update) → evaluation on the held-out split (16 tasks
× 4 seeds, sampled at temperature 1). What is plugged in, for the duration of a run only: the test envs
(:mod:`tests.train.learn_envs`) in ``runconfig.ENVS``, and their prompt template and projection as the loop's
``run_episodes`` arguments (``template=``, ``projector=``). The runs use a word-level tokenizer of 39 tokens
(:mod:`agentjax.models.word_tokenizer`; Qwen's 151,936-row vocabulary makes every decode step cost ~0.1 s on this
CPU), saved to a folder that the run's ``tokenizer`` names (the loop loads a word tokenizer folder as it is).

- Contextual bandit (the observation names which of 4 actions pays): GRPO goes from chance (≈ 0.25) to ≥ 0.9
  success on fresh episodes in 20 updates of 64 episodes.
- Chain of 3 steps, 2 admissible actions per step, a wrong action ends the episode, reward only at the end:
  every credit method (grpo, rloo, ppo, gigpo, hgpo, graphgpo, crbc) goes from chance (1/8) to ≥ 0.6 (chance
  cannot reach it) in 16 updates.
- Every run's importance ratio stays at 1 (the behaviour log-probs are the trainer's).
- The bandit run with one bug planted fails: the advantages' sign flipped, the advantages one row off, the
  trainer's log-probs read one position late (from the hidden state after each token: the off-by-one between
  logits and targets) — none learns; the behaviour log-probs one token off — it still learns (PPO-clip follows
  the advantage's sign), and the ratio check catches it.

Sizes are one batch shape for both envs so that the compiled programs are shared (the update compiles three times:
once for grpo / rloo / gigpo / hgpo / graphgpo and the bandit, once for PPO's value head, once for CRBC, whose
credit statistics are another pytree), and once more for the planted off-by-one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import types

import jax.numpy as jnp
import pytest

from agentjax.agents import project_action
from agentjax.models.word_tokenizer import ENDOFTEXT, IM_END, load_word_tokenizer, word_tokenizer
from agentjax.rollout.collect import CollectConfig
from agentjax.train import flat, presets, runconfig, shares, trainer
from agentjax.train import update as update_module
from agentjax.train.config import ModelConfig
from agentjax.train.metrics import read_metrics
from agentjax.train.runconfig import EnvSpec, RunConfig
from tests.train.learn_envs import BANDIT_TEMPLATE, CHAIN_LENGTH, CHAIN_TEMPLATE, CueBandit, CueChain, corpus

METHODS = ("grpo", "rloo", "ppo", "gigpo", "hgpo", "graphgpo", "crbc")
FAST_METHODS = ("grpo", "crbc")  # for CI time, the chain of the others is `make test-slow`'s (README, "Tests")
PROMPT_LEN = 32  # the longest prompt (a chain step) is 29 tokens
RESPONSE_LEN = 4  # "<action>", the colour, "</action>", the stop token
SPECS = {
    env.name: EnvSpec(env.name, "tests.train.learn_envs", env.__name__, "train", "eval", CollectConfig, "nothing")
    for env in (CueBandit, CueChain)
}
TEMPLATES = {CueBandit.name: BANDIT_TEMPLATE, CueChain.name: CHAIN_TEMPLATE}


@pytest.fixture(scope="module", autouse=True)
def _optimised(optimised_xla):
    """Hundreds of updates: XLA's optimisations pay for themselves here (tests/conftest.py turns them off)."""


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("word_tokenizer")
    word_tokenizer(corpus(), folder)
    return str(folder)


@contextlib.contextmanager
def registered(env: str):
    """``env`` known to the trainer: its spec in ``runconfig.ENVS`` (a read-only mapping, so replaced whole), and its
    prompt template and projection passed to every ``run_episodes`` call of the trainer, its batches' and its
    evaluation's, both played through :mod:`agentjax.train.shares` (their ``template=`` / ``projector=`` arguments,
    for envs outside the built-in tables)."""
    plug = dict(template=TEMPLATES[env], projector=project_action)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(runconfig, "ENVS", types.MappingProxyType(dict(runconfig.ENVS) | SPECS))
        mp.setattr(shares, "run_episodes", functools.partial(shares.run_episodes, **plug))  # training's, evaluation's
        yield mp


# The test's own step, not the Sokoban preset's (which is tuned for its warm start and changes with it).
LEARNING_RATE = 1e-3


def learn_run(env: str, method: str, out_dir, tokenizer_dir: str, *, updates: int, num_groups: int, max_steps: int,
              capacity: int, micro_batch_size: int, mini_batches: int) -> RunConfig:
    """The ``tiny`` preset (loss, constrained decoding with masked log-probs) at :data:`LEARNING_RATE` on a smaller
    policy (1 layer, d = 64, 64 vocabulary rows for the word tokenizer's 39 tokens) and a test env: ``num_groups`` × 8
    rollouts per update, evaluation before the first and after the last update on 16 eval tasks × 4 sampled seeds
    (temperature 1), no checkpoints."""
    tokenizer = load_word_tokenizer(tokenizer_dir)
    base = presets.tiny(method)
    arch = presets.tiny_arch(vocab_size=64, d_model=64, mlp_dim=128, num_layers=1, num_heads=4, num_kv_heads=2,
                             head_dim=16, name="tiny-qwen2-words")
    optimizer = dataclasses.replace(base.train.optimizer, learning_rate=LEARNING_RATE)
    train = base.train.replace(model=ModelConfig(arch), optimizer=optimizer, mini_batches=mini_batches)
    sampling = dataclasses.replace(base.collect.sampling, prompt_bucket=PROMPT_LEN,
                                   stop_token_ids=tuple(tokenizer.convert_tokens_to_ids([IM_END, ENDOFTEXT])))
    collect = base.collect.replace(history_length=0, batch_bucket=64, sampling=sampling)
    run = base.replace(env=env, train=train, collect=collect, warm_start=None, tokenizer=tokenizer_dir)
    run = run.with_sizes(num_groups=num_groups, group_size=8, max_steps=max_steps, prompt_len=PROMPT_LEN,
                         response_len=RESPONSE_LEN, capacity=capacity, micro_batch_size=micro_batch_size)
    return run.replace(updates=updates, eval_every=updates, eval_at_start=True, eval_tasks=16, eval_seeds=4,
                       checkpoint_every=0, out_dir=str(out_dir), progress=False, tensorboard=False)


@dataclasses.dataclass(frozen=True)
class Learnt:
    """What a run learnt, from its metrics lines."""

    initial: float  # eval success before the first update (16 tasks x 4 sampled seeds)
    final: float  # eval success after the last update
    train: tuple[float, ...]  # rollout success of each update's batch (collected before the update)
    ratio: tuple[float, ...]  # mean importance ratio π_θ / π_old over each update's trained tokens and steps

    @property
    def ratio_error(self) -> float:
        """The largest |ratio − 1| of any update. π_old is the sampler's log-prob of the token it emitted; the
        trainer recomputes it, so the ratio is 1 at each update's first step and moves only by the update's own
        optimizer steps (≤ 0.02 in these runs)."""
        return max(abs(r - 1.0) for r in self.ratio)

    def __str__(self) -> str:
        return (f"eval success {self.initial:.3f} -> {self.final:.3f}; train success "
                f"{' '.join(f'{x:.2f}' for x in self.train)}; max |ratio - 1| {self.ratio_error:.3f}")


def train(run: RunConfig) -> Learnt:
    summary = trainer.train(run)
    lines = read_metrics(run.out_dir)
    assert lines[0]["step"] == 0 and summary["step"] == run.updates
    return Learnt(initial=lines[0]["eval/success_rate"], final=summary["last_eval"]["success_rate"],
                  train=tuple(line["rollout/success_rate"] for line in lines[1:]),
                  ratio=tuple(line["train/ratio_mean"] for line in lines[1:]))


# One batch shape (192 rows: the chain's 8 groups x 8 rollouts x 3 steps) for both envs, so that the runs share the
# compiled sampler and update (module docstring).
SHAPE = dict(num_groups=8, capacity=8 * 8 * CHAIN_LENGTH, micro_batch_size=16, mini_batches=4)
BANDIT = dict(SHAPE, updates=20, max_steps=1)
CHAIN = dict(SHAPE, updates=16, max_steps=CHAIN_LENGTH)
BANDIT_CHANCE, CHAIN_CHANCE = 1 / 4, 1 / 2 ** CHAIN_LENGTH
RATIO_TOLERANCE = 0.05


def bandit(out_dir, tokenizer_dir) -> Learnt:
    with registered(CueBandit.name):
        return train(learn_run(CueBandit.name, "grpo", out_dir, tokenizer_dir, **BANDIT))


def learnt_the_bandit(out: Learnt) -> bool:
    return out.final >= 0.9 and out.ratio_error <= RATIO_TOLERANCE


@pytest.fixture(scope="module")
def grpo_bandit(tmp_path_factory, tokenizer_dir) -> Learnt:
    return bandit(tmp_path_factory.mktemp("bandit"), tokenizer_dir)


def test_grpo_learns_the_contextual_bandit(grpo_bandit):
    print(f"\nbandit grpo: {grpo_bandit}")
    assert abs(grpo_bandit.initial - BANDIT_CHANCE) <= 0.15, grpo_bandit  # a random policy: chance
    assert learnt_the_bandit(grpo_bandit), grpo_bandit


@pytest.mark.parametrize("method", [m if m in FAST_METHODS else pytest.param(m, marks=pytest.mark.slow)
                                    for m in METHODS])
def test_every_method_learns_the_chain(method, tmp_path, tokenizer_dir):
    with registered(CueChain.name):
        out = train(learn_run(CueChain.name, method, tmp_path, tokenizer_dir, **CHAIN))
    print(f"\nchain {method}: {out}")
    assert out.initial <= CHAIN_CHANCE + 0.15, out
    assert out.final >= 0.6, out  # chance 1/8: P(>= 39 of 64 episodes) ≈ 1e-19
    assert out.ratio_error <= RATIO_TOLERANCE, out


# -- planted bugs --------------------------------------------------------------------------------------------------
def _edit_advantages(mp: pytest.MonkeyPatch, edit) -> None:
    real = flat.compute_advantages

    def compute_advantages(*args, **kwargs):
        adv = real(*args, **kwargs)
        return adv.replace(advantage=edit(adv.advantage))

    mp.setattr(flat, "compute_advantages", compute_advantages)


def negated_advantages(mp: pytest.MonkeyPatch) -> None:
    """A sign error between the credit kernels and the loss."""
    _edit_advantages(mp, lambda adv_b: -adv_b)


def advantages_one_row_off(mp: pytest.MonkeyPatch) -> None:
    """Each row gets the advantage of the row before it (credit scattered back to the wrong turns)."""
    _edit_advantages(mp, lambda adv_b: jnp.roll(adv_b, 1))


def behaviour_logp_one_token_off(mp: pytest.MonkeyPatch) -> None:
    """The collector's behaviour log-probs one response position off their tokens."""
    real = shares.to_step_batch

    def to_step_batch(*args, **kwargs):
        batch = real(*args, **kwargs)
        return batch.replace(behaviour_logp=jnp.roll(batch.behaviour_logp, -1, axis=1))

    mp.setattr(shares, "to_step_batch", to_step_batch)


def logprobs_one_token_late(mp: pytest.MonkeyPatch) -> None:
    """The trainer reads each response token's log-prob from the hidden state after that token instead of the one
    before it (the off-by-one between logits and targets). Traced into a fresh update: ``trainer.optimizer`` caches
    the optimizer per config and ``make_update`` the compiled update per optimizer, so the caller clears it before
    and after."""
    real = update_module.allowed_logprobs

    def late(hidden_bld, *args, **kwargs):
        return real(jnp.concatenate([hidden_bld[:, 1:], hidden_bld[:, -1:]], axis=1), *args, **kwargs)

    mp.setattr(update_module, "allowed_logprobs", late)


@pytest.mark.parametrize("bug", [negated_advantages, advantages_one_row_off, behaviour_logp_one_token_off,
                                 pytest.param(logprobs_one_token_late, marks=pytest.mark.slow)],  # recompiles: CI time
                         ids=lambda f: f.__name__)
def test_a_planted_bug_fails_the_bandit(bug, tmp_path, tokenizer_dir):
    fresh = bug is logprobs_one_token_late
    if fresh:
        trainer.optimizer.cache_clear()
    try:
        with pytest.MonkeyPatch.context() as mp:
            bug(mp)
            out = bandit(tmp_path, tokenizer_dir)
    finally:
        if fresh:  # the sabotaged update must not serve the next run
            trainer.optimizer.cache_clear()
    print(f"\nbandit grpo with {bug.__name__}: {out}")
    assert not learnt_the_bandit(out), out
    if bug is behaviour_logp_one_token_off:  # only the ratio moves (PPO-clip still follows the advantage's sign)
        assert out.ratio_error > 0.3, out
    else:  # no learning: the last half of the run's batches and the final evaluation stay near (or below) chance
        assert sum(out.train[-10:]) / 10 <= BANDIT_CHANCE + 0.15 and out.final <= 0.5, out
