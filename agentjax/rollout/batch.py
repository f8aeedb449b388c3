"""`StepBatch`: one row per policy turn, fixed capacity, padding by masks (DESIGN.md, "Core data").

The collector appends turns on the host and converts them once into this frozen pytree; from here on every
operation is a pure, jittable function of arrays. Rows belong to a group (the G rollouts of one task from one
reset state), a rollout inside the group and a step inside the rollout; ``row_mask`` marks real rows.
"""

from __future__ import annotations

import flax.struct
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

NO_ID = -1  # id of a missing anchor / action / tree node


@flax.struct.dataclass(frozen=True)
class StepBatch:
    """A batch of policy turns (verl-agent's row-per-turn layout).

    Termination follows jumanji/rlax conventions: ``terminated`` marks a true terminal (success or failure
    state of the environment), ``truncated`` a time-limit cut; ``won`` is the binary task success of the
    episode, set on its last row (credit kernels take the maximum over the rollout's rows).
    """

    prompt_tokens: Int[Array, "B Lp"]  # [B, Lp] int32, left-padded prompt
    prompt_mask: Bool[Array, "B Lp"]  # [B, Lp] bool, real prompt tokens
    response_tokens: Int[Array, "B Lr"]  # [B, Lr] int32, right-padded response
    response_mask: Bool[Array, "B Lr"]  # [B, Lr] bool, tokens that the loss trains
    behaviour_logp: Float[Array, "B Lr"]  # [B, Lr] float32, log pi_old(token) at sampling time
    reward: Float[Array, " B"]  # [B] float32, env reward of the turn incl. invalid-action penalty
    done: Bool[Array, " B"]  # [B] bool, last turn of its episode (terminated or truncated)
    terminated: Bool[Array, " B"]  # [B] bool, episode ended in a terminal state
    truncated: Bool[Array, " B"]  # [B] bool, episode cut by the step limit
    won: Bool[Array, " B"]  # [B] bool, task success (on the episode's last row)
    valid: Bool[Array, " B"]  # [B] bool, the action parsed and was admissible
    group: Int[Array, " B"]  # [B] int32, group index in [0, G)
    task: Int[Array, " B"]  # [B] int32, task index in the split's manifest
    rollout: Int[Array, " B"]  # [B] int32, rollout index in [0, R)
    step: Int[Array, " B"]  # [B] int32, step index in [0, T)
    anchor: Int[Array, " B"]  # [B] int32, id of the exact observation text (NO_ID: none)
    next_anchor: Int[Array, " B"]  # [B] int32, id of the next observation (also at episode end; NO_ID: none)
    action: Int[Array, " B"]  # [B] int32, id of the executed, parsed action text
    node: Int[Array, " B"]  # [B] int32, SERA tree node (NO_ID outside recursive agents)
    parent: Int[Array, " B"]  # [B] int32, parent tree node (NO_ID at the root)
    depth: Int[Array, " B"]  # [B] int32, recursion depth of the node (0 at the root)
    row_mask: Bool[Array, " B"]  # [B] bool, real row (False: padding)
    # [B, Lr, A] int32: the tokens the constrained decoder could emit at each response position (NO_ID padding),
    # or None: the policy's distribution is the full vocabulary. With it the trainer renormalises log π over them.
    allowed_tokens: Int[Array, "B L A"] | None = None

    @property
    def capacity(self) -> int:
        return self.reward.shape[0]

    @classmethod
    def empty(cls, capacity: int, prompt_len: int, response_len: int) -> StepBatch:
        """A batch with every row padding; fill it with :func:`StepBatch.from_numpy`-style host arrays."""
        b, lp, lr = capacity, prompt_len, response_len
        i = lambda *s: jnp.zeros(s, jnp.int32)  # noqa: E731
        f = lambda *s: jnp.zeros(s, jnp.float32)  # noqa: E731
        z = lambda *s: jnp.zeros(s, bool)  # noqa: E731
        none = jnp.full((b,), NO_ID, jnp.int32)
        return cls(
            prompt_tokens=i(b, lp), prompt_mask=z(b, lp), response_tokens=i(b, lr), response_mask=z(b, lr),
            behaviour_logp=f(b, lr), reward=f(b), done=z(b), terminated=z(b), truncated=z(b), won=z(b),
            valid=z(b), group=i(b), task=i(b), rollout=i(b), step=i(b), anchor=none, next_anchor=none,
            action=none, node=none, parent=none, depth=i(b), row_mask=z(b),
        )

    @classmethod
    def from_rows(cls, capacity: int, prompt_len: int, response_len: int, **fields: np.ndarray) -> StepBatch:
        """Pack host arrays of ``n <= capacity`` real rows into a padded batch of ``capacity`` rows.

        Every given field must have ``n`` rows (token fields may be shorter than ``prompt_len`` /
        ``response_len``; they are padded). Missing fields keep the values of :meth:`empty`.
        """
        batch = cls.empty(capacity, prompt_len, response_len)
        sizes = {k: np.asarray(v).shape[0] for k, v in fields.items()}
        if len(set(sizes.values())) > 1:
            raise ValueError(f"StepBatch.from_rows: fields disagree on the number of rows: {sizes}")
        n = next(iter(sizes.values()), 0)
        if n > capacity:
            raise ValueError(f"StepBatch.from_rows: {n} rows do not fit capacity {capacity}; raise capacity")
        unknown = set(fields) - set(batch.__dataclass_fields__)
        if unknown:
            raise ValueError(f"StepBatch.from_rows: unknown fields {sorted(unknown)}")
        updates = {}
        for name, value in fields.items():
            value = np.asarray(value)
            if name == "allowed_tokens":
                if value.ndim != 3 or value.shape[1] > response_len:
                    raise ValueError(f"StepBatch.from_rows: allowed_tokens must be [rows, <= {response_len}, A], got "
                                     f"shape {value.shape}")
                base = np.full((capacity, response_len, value.shape[2]), NO_ID, np.int32)
                base[:n, : value.shape[1]] = value
                updates[name] = jnp.asarray(base)
                continue
            base = np.array(getattr(batch, name))
            if value.ndim == 2:
                if name == "prompt_tokens" or name == "prompt_mask":  # left padding
                    base[:n, base.shape[1] - value.shape[1]:] = value
                else:
                    base[:n, : value.shape[1]] = value
            else:
                base[:n] = value
            updates[name] = jnp.asarray(base)
        updates.setdefault("row_mask", jnp.arange(capacity) < n)
        return batch.replace(**updates)

