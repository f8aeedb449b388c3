"""What a node of a tree reads and how its reply's tokens are labelled, for the tree collector
(:mod:`agentjax.rollout.tree_collect`).

- :func:`node_messages` / :func:`node_prompt` — a node's next prompt: a system message (the world's grammar;
  ``launch_subagent`` / ``<delegate>`` only while the node may delegate), the node's first message (goal, state at its
  start), then its own turns as assistant replies and user feedback (the last ``history_length``; older turns are
  dropped first when the prompt passes ``max_prompt_tokens``, then ``truncation`` applies as in the flat collector).
- :func:`token_roles` — the :class:`~agentjax.agents.grammar.Role` of each response token, from the character spans
  of the parsed reply, so that each of SERA's objectives trains only its tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from agentjax.agents.grammar import Role
from agentjax.agents.prompts import encode_prompt
from agentjax.agents.tree import Node, Tree, TreeWorld
from agentjax.rollout.calls import encode_messages
from agentjax.rollout.policy import Tokenizer
from agentjax.rollout.tree_config import TreeCollectConfig


def node_messages(world: TreeWorld, tree: Tree, node: Node, history: int | None) -> list[dict[str, str]]:
    """The chat messages of a node's next turn (module docstring) with its last ``history`` turns."""
    messages = [dict(role="system", content=world.system_prompt(tree.limits.can_delegate(node.depth))),
                dict(role="user", content=node.intro)]
    turns = node.turns if history is None else node.turns[len(node.turns) - history:] if history else []
    for turn in turns:
        messages.append(dict(role="assistant", content=turn.reply.text))
        messages.append(dict(role="user", content=f"{turn.feedback}\n({node.budget - turn.step - 1} steps left)"))
    return messages


def node_prompt(tokenizer: Tokenizer, world: TreeWorld, tree: Tree, node: Node, config: TreeCollectConfig,
                ) -> tuple[list[int], bool]:
    """The prompt ids of a node's next turn (module docstring) and whether turns were dropped or the prompt cut."""
    wanted = len(node.turns) if config.history_length is None else min(config.history_length, len(node.turns))
    history = wanted
    while True:
        ids = encode_prompt(tokenizer, node_messages(world, tree, node, history))
        if len(ids) <= config.max_prompt_tokens or history == 0:
            break
        history -= 1  # drop the oldest turn shown
    if len(ids) <= config.max_prompt_tokens:
        return ids, history < wanted
    where = f"tree {tree.index} of task {tree.task.task_id!r}, node {node.id}, turn {len(node.turns)}"
    ids, _ = encode_messages(tokenizer, node_messages(world, tree, node, 0), max_prompt_tokens=config.max_prompt_tokens,
                             truncation=config.truncation, where=where)
    return ids, True


def token_roles(tokenizer: Tokenizer, response_ids: Sequence[int] | np.ndarray, text: str,
                spans: Sequence[tuple[int, int, Role]], stop_ids: Sequence[int]) -> np.ndarray:
    """[n] int8 role of each response token: a token whose characters overlap a span takes its role, every other
    token (stop tokens included) is :attr:`Role.EXECUTION`. ``text`` is the decoded reply without stop tokens."""
    ids = [int(t) for t in response_ids]
    roles = np.full(len(ids), int(Role.EXECUTION), np.int8)
    if not spans:
        return roles
    stops = set(int(s) for s in stop_ids)
    body = [t for t in ids if t not in stops]
    pieces = [tokenizer.decode([t]) for t in body]
    if "".join(pieces) == text:
        ends = np.cumsum([len(p) for p in pieces]).tolist()
    else:  # a character split over tokens: decode prefixes
        ends = [len(tokenizer.decode(body[: j + 1])) for j in range(len(body))]
    j = 0
    for i, t in enumerate(ids):
        if t in stops:
            continue
        lo, hi = (ends[j - 1] if j else 0), ends[j]
        for start, end, role in spans:
            if lo < end and hi > start:
                roles[i] = int(role)
        j += 1
    return roles


__all__ = ["node_messages", "node_prompt", "token_roles"]
