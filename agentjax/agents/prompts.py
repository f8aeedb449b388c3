"""Prompt templates per environment, in the verl-agent style, and the chat-message / token form of a prompt.

One policy turn reads one user message built from the current :class:`envs.base.Obs` and a window of the most
recent ``(observation, action)`` records (verl-agent ``env_manager.py``, ``build_text_obs`` with
``history_length``; METHODS.md default: 2 records)::

    first turn  (step 0, or history_length 0):   template.first_turn
    later turns (step t ≥ 1):                     template.with_history, with
        step_count     = t                         (steps already taken)
        history_length = k = min(t, history_length) (records actually shown)
        action_history = "[Observation j: '{o_j}', Action j: '{a_j}']" for j = t-k+1 .. t, joined by "\\n"
        current_step   = t + 1                     (1-based, as in verl-agent)

Record j is the observation text the policy saw before its j-th action and that action (verl-agent stores
``pre_text_obs`` with the executed action). The admissible actions are rendered item by item (ALFWorld:
``'a'`` joined by ``"\\n "``, exactly verl-agent's ``"\\n ".join(f"'{s}'" ...)``; WebShop: ``'a',`` one per line)
into the template's ``admissible_block``, which is left out when the environment has no list
(``Obs.admissible is None``).

Where these templates deviate from verl-agent (``agent_system/environments/prompts/*.py``), on purpose:

- typo fixed: "observaitons" -> "observations"; verl-agent's leading and trailing newline of each template and
  the stray space before the newline after "<think> </think> tags." are dropped; WebShop's non-breaking hyphen
  in "e‑commerce" is a plain "-", and no "." is appended after the task and the observation (our
  instructions already end in one).
- the first-turn ALFWorld template also states the task ("Your task is to: ..."), as verl-agent's later
  revision does: the first observation of ALFWorld repeats it, but with ``history_length=0`` the first-turn
  template is used at every step and the task would otherwise never be shown.
- the task comes from ``Obs.instruction`` with a leading "Your task is to:" removed (so it is not doubled).
- TextCraft, TextCraft-Synth, TextWorld (cooking) and the credit-testbed MDPs have no verl-agent template; theirs
  follow the ALFWorld layout. TextCraft's crafting commands are part of its task: the environment should keep them in
  ``Obs.instruction`` so they stay visible after the first observation leaves the history window.

No system message (``PromptTemplate.system = None``), as in verl-agent: the Qwen2.5 chat template then inserts
its default system prompt. Templates are data: import the one you need, or look it up in :data:`TEMPLATES` by
environment name.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from envs.base import Obs

TASK_PREFIX = "Your task is to:"


@dataclasses.dataclass(frozen=True)
class PromptTemplate:
    """The user-message templates of one environment.

    ``first_turn`` / ``with_history`` are :meth:`str.format` templates over the keys ``task_description``,
    ``current_observation``, ``admissible_block``, ``action_hint`` and (``with_history`` only) ``step_count``,
    ``history_length``, ``action_history``, ``current_step``; a template may leave any of them out.
    """

    name: str  # the environment's name, as in ``Env.name`` / ``Task.env``
    first_turn: str  # step 0 (or every step when history_length = 0)
    with_history: str  # steps ≥ 1: adds the step count and the window of (observation, action) records
    action_hint: str  # the answer-format instruction: reason in <think> </think>, answer in <action> </action>
    admissible_block: str = ""  # the sentence listing the admissible actions, a format string over {actions}
    action_item: str = "'{action}'"  # how one admissible action is written in {actions}
    action_sep: str = "\n "  # what joins the written actions (verl-agent ALFWorld: "\n ")
    system: str | None = None  # a system message, or None for the chat template's default
    render: Callable[[str], str] | None = None  # the shown text of an observation's text (None: as it is)

    def show(self, text: str) -> str:
        """An observation's text as this template shows it (current observation and history records)."""
        return text if self.render is None else self.render(text)


@runtime_checkable
class ChatTokenizer(Protocol):
    """What :func:`encode_prompt` needs of a tokenizer: ``transformers``' ``apply_chat_template``."""

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...


def task_description(instruction: str) -> str:
    """The task text of an instruction, without a leading "Your task is to:" and surrounding whitespace."""
    text = instruction.strip()
    if text.lower().startswith(TASK_PREFIX.lower()):
        text = text[len(TASK_PREFIX) :].strip()
    return text


def render_admissible(template: PromptTemplate, admissible: Sequence[str] | None) -> str:
    """``template.admissible_block`` with the actions written in, or ``""`` without a list (or a block)."""
    if admissible is None or not template.admissible_block:
        return ""
    actions = template.action_sep.join(template.action_item.format(action=a) for a in admissible)
    return template.admissible_block.format(actions=actions)


def render_history(records: Sequence[tuple[str, str]], first_step: int) -> str:
    """``[Observation j: 'o', Action j: 'a']`` per record, j counting from ``first_step``, one per line."""
    return "\n".join(
        f"[Observation {j}: '{obs}', Action {j}: '{action}']"
        for j, (obs, action) in enumerate(records, start=first_step)
    )


def build_prompt(
    template: PromptTemplate,
    obs: Obs,
    history: Sequence[tuple[str, str]],
    step: int,
    history_length: int = 2,
) -> str:
    """The user message of the turn at ``step`` (number of actions already taken, 0 at reset).

    Args:
      template: the environment's :class:`PromptTemplate`.
      obs: the current observation; ``obs.text`` is shown, ``obs.admissible`` listed (when not None),
        ``obs.instruction`` gives the task.
      history: the ``(observation text, action)`` records of the steps before this one, oldest first: the whole
        episode so far or at least its last ``min(step, history_length)`` records (never more than ``step``).
      step: t ≥ 0; t = 0 uses ``template.first_turn``.
      history_length: K ≥ 0, the number of most recent records shown; K = 0 uses ``template.first_turn`` at
        every step (verl-agent's ``history_length <= 0`` case).

    Returns: the prompt text, with records t-k+1 .. t shown (k = min(t, K)) and numbered from 1 at reset.
    """
    if step < 0:
        raise ValueError(f"build_prompt: step must be >= 0, got {step}")
    if history_length < 0:
        raise ValueError(f"build_prompt: history_length must be >= 0, got {history_length}")
    if len(history) > step:
        raise ValueError(f"build_prompt: {len(history)} history records but only {step} steps taken")
    fields = dict(
        task_description=task_description(obs.instruction),
        current_observation=template.show(obs.text),
        admissible_block=render_admissible(template, obs.admissible),
        action_hint=template.action_hint,
    )
    if step == 0 or history_length == 0:
        return template.first_turn.format(**fields)
    k = min(step, history_length)
    if len(history) < k:
        raise ValueError(f"build_prompt: step {step} with history_length {history_length} needs {k} records, "
                         f"got {len(history)}")
    window = history[len(history) - k :]
    return template.with_history.format(
        **fields,
        step_count=step,
        history_length=k,
        action_history=render_history([(template.show(o), a) for o, a in window], first_step=step - k + 1),
        current_step=step + 1,
    )


def build_messages(
    template: PromptTemplate,
    obs: Obs,
    history: Sequence[tuple[str, str]],
    step: int,
    history_length: int = 2,
) -> list[dict[str, str]]:
    """The chat messages of a turn: ``template.system`` (when set) and the :func:`build_prompt` user message."""
    messages = [] if template.system is None else [dict(role="system", content=template.system)]
    messages.append(dict(role="user", content=build_prompt(template, obs, history, step, history_length)))
    return messages


def encode_prompt(tokenizer: ChatTokenizer, messages: Sequence[Mapping[str, str]]) -> list[int]:
    """Token ids of ``messages`` under the tokenizer's chat template, ending in the generation prompt.

    ``tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)``;
    ``transformers`` 5 returns a ``BatchEncoding`` unless ``return_dict=False``, so a mapping answer is read
    through its ``input_ids`` too. For Qwen2.5 the ids start with ``<|im_start|>`` and end with
    ``<|im_start|>assistant\\n``.
    """
    ids = tokenizer.apply_chat_template(
        [dict(m) for m in messages], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    if isinstance(ids, Mapping):
        ids = ids["input_ids"]
    ids = list(ids)
    if ids and not isinstance(ids[0], int):
        raise TypeError(f"encode_prompt: expected a flat list of token ids, got items of type {type(ids[0])}")
    return [int(i) for i in ids]


# --------------------------------------------------------------------------------------------------------------
# The templates.

_THINK_THEN_ACT = (
    "You should first reason step-by-step about the current situation. This reasoning process MUST be enclosed "
    "within <think> </think> tags.\n"
    "Once you've finished your reasoning, you should choose an admissible action for current step and present it "
    "within <action> </action> tags."
)
_ADMISSIBLE = "Your admissible actions of the current situation are: [{actions}].\n"
_HISTORY = (
    "Prior to this step, you have already taken {step_count} step(s). Below are the most recent {history_length} "
    "observations and the corresponding actions you took: {action_history}\n"
)
# The layout shared by every template but Sokoban's: intro (role + task), [history], observation, actions, hint.
_FIRST = "Your current observation is: {current_observation}\n{admissible_block}\n{action_hint}"
_LATER = (
    _HISTORY
    + "You are now at step {current_step} and your current observation is: {current_observation}\n"
    + "{admissible_block}\n{action_hint}"
)

# ALFWorld (verl-agent prompts/alfworld.py).
_ALFWORLD_INTRO = (
    "You are an expert agent operating in the ALFRED Embodied Environment. Your task is to: {task_description}\n"
)
ALFWORLD = PromptTemplate(
    name="alfworld",
    first_turn=_ALFWORLD_INTRO + _FIRST,
    with_history=_ALFWORLD_INTRO + _LATER,
    action_hint="Now it's your turn to take an action.\n" + _THINK_THEN_ACT,
    admissible_block=_ADMISSIBLE,
)

# Sokoban (verl-agent prompts/sokoban.py, after RAGEN): the legend assumes RAGEN's grid rendering
# (# wall, _ floor, O target, X box, P player, √ box on target, S player on target).
_SOKOBAN_INTRO = (
    "You are an expert agent operating in the Sokoban environment.\n\n"
    "# Symbols and Their Meaning\n"
    "- Walls (`#`): These block movement. You can't move through or push anything into walls.\n"
    "- Floor (`_`): Open spaces where you can walk and move boxes.\n"
    "- Targets (`O`): The spots where boxes need to go.\n"
    "- Boxes (`X`): These are what you need to push onto the targets.\n"
    "- Player (`P`): That's you! You'll move around the grid to push boxes.\n"
    "- Box on Target (`√`): A box successfully placed on a target.\n"
    "- Player on Target (`S`): You standing on a target.\n\n"
    "# Your Goal\n"
    "Your goal is to push all the boxes (`X`) onto the target spots (`O`). Once all boxes are on the targets, "
    "you win!\n\n"
    "# Rules\n"
    "You can only push boxes. You can't pull them, so plan ahead to avoid getting stuck.\n"
    "You can't walk through or push boxes into walls (`#`).\n"
    "To avoid traps, do not push boxes into corners or against walls where they can't be moved again.\n\n"
    "# Current Step\n"
)
_SOKOBAN_ACTIONS = 'Your admissible actions are ["up", "down", "left", "right"].\n\n{action_hint}'
SOKOBAN = PromptTemplate(
    name="sokoban",
    first_turn=_SOKOBAN_INTRO + "Your current observation is:\n{current_observation}\n" + _SOKOBAN_ACTIONS,
    with_history=(
        _SOKOBAN_INTRO
        + _HISTORY
        + "You are now at step {current_step} and your current observation is:\n{current_observation}\n"
        + _SOKOBAN_ACTIONS
    ),
    action_hint=(
        "Now it's your turn to make a move (choose ONE action only for the current step).\n"
        "You should first reason step-by-step about the current situation — observe the positions of boxes and "
        "targets, plan a path to push a box toward a target, and avoid traps like corners or walls. This reasoning "
        "process MUST be enclosed within <think> </think> tags.\n"
        "Once you've finished your reasoning, you should choose an admissible action for current step and present "
        "it within <action> </action> tags."
    ),
)

# WebShop (verl-agent prompts/webshop.py): actions are search[<query>] and click[<button>], one per line.
_WEBSHOP_INTRO = (
    "You are an expert autonomous agent operating in the WebShop e-commerce environment.\n"
    "Your task is to: {task_description}\n"
)
WEBSHOP = PromptTemplate(
    name="webshop",
    first_turn=_WEBSHOP_INTRO + _FIRST,
    with_history=_WEBSHOP_INTRO + _LATER,
    action_hint=(
        "Now it's your turn to take one action for the current step.\n"
        "You should first reason step-by-step about the current situation, then think carefully which admissible "
        "action best advances the shopping goal. This reasoning process MUST be enclosed within <think> </think> "
        "tags.\n"
        "Once you've finished your reasoning, you should choose an admissible action for current step and present it "
        "within <action> </action> tags."
    ),
    admissible_block="Your admissible actions of the current situation are:\n[\n{actions}\n].\n",
    action_item="'{action}',",
    action_sep="\n",
)

# TextCraft (no verl-agent template): free-form commands get / craft / inventory.
_TEXTCRAFT_INTRO = (
    "You are an expert agent operating in the TextCraft crafting environment. Your task is to: {task_description}\n"
)
_TEXTCRAFT_HINT = (
    "Now it's your turn to take an action.\n"
    "You can use three commands: 'get <count> <item>' to fetch a base item from the environment, "
    "'craft <count> <item> using <count> <ingredient>, <count> <ingredient>, ...' to apply one of the crafting "
    "commands, and 'inventory' to list the items you hold.\n"
    "You should first reason step-by-step about the current situation. This reasoning process MUST be enclosed "
    "within <think> </think> tags.\n"
    "Once you've finished your reasoning, you should choose one command for the current step and present it within "
    "<action> </action> tags."
)
TEXTCRAFT = PromptTemplate(
    name="textcraft",
    first_turn=_TEXTCRAFT_INTRO + _FIRST,
    with_history=_TEXTCRAFT_INTRO + _LATER,
    action_hint=_TEXTCRAFT_HINT,
    admissible_block=_ADMISSIBLE,
)
TEXTCRAFT_SYNTH = dataclasses.replace(TEXTCRAFT, name="textcraft_synth")

# TextWorld CookingWorld (no verl-agent template).
_TEXTWORLD_INTRO = (
    "You are an expert agent playing a TextWorld cooking game: find the recipe, gather and process the ingredients "
    "it lists (e.g. 'slice red apple with knife', 'cook red apple with stove'), then 'prepare meal' and "
    "'eat meal'. Your task is to: {task_description}\n"
)
TEXTWORLD = PromptTemplate(
    name="textworld",
    first_turn=_TEXTWORLD_INTRO + _FIRST,
    with_history=_TEXTWORLD_INTRO + _LATER,
    action_hint=(
        "Now it's your turn to take an action.\n"
        "You should first reason step-by-step about the current situation. This reasoning process MUST be enclosed "
        "within <think> </think> tags.\n"
        "Once you've finished your reasoning, you should choose one command for the current step and present it "
        "within <action> </action> tags."
    ),
    admissible_block=_ADMISSIBLE,
)

# TextWorld-Sync, the released benchmark (envs/textworld_sync: the authors' small shared-world engine).
_TEXTWORLD_SYNC_INTRO = (
    "You are an expert agent in a shared cooking world with several dishes to make. Collect each ingredient "
    "('take <item>'), process it exactly as its dish's recipe asks ('slice <item>', 'cook <item> in oven', 'cook "
    "<item> on grill', ...), then 'prepare <dish>' and 'eat <dish>' for every dish. Only the listed commands work; "
    "every command uses one step of a budget shared with any other agent in the world, except 'inventory', which "
    "shows the shared inventory for free. Your task is to: {task_description}\n"
)
TEXTWORLD_SYNC = dataclasses.replace(
    TEXTWORLD,
    name="textworld_sync",
    first_turn=_TEXTWORLD_SYNC_INTRO + _FIRST,
    with_history=_TEXTWORLD_SYNC_INTRO + _LATER,
)

# The credit-testbed MDPs (envs/mdp; no verl-agent template): the observation names the room and its exits.
_MDP_INTRO = "You are an expert agent walking through rooms towards a goal. Your task is to: {task_description}\n"
MDP = PromptTemplate(
    name="mdp",
    first_turn=_MDP_INTRO + _FIRST,
    with_history=_MDP_INTRO + _LATER,
    action_hint="Now it's your turn to choose an exit.\n" + _THINK_THEN_ACT,
    admissible_block=_ADMISSIBLE,
)

# Environment name -> template (data, read-only).
TEMPLATES: Mapping[str, PromptTemplate] = types.MappingProxyType(
    {t.name: t for t in (ALFWORLD, SOKOBAN, WEBSHOP, TEXTCRAFT, TEXTCRAFT_SYNTH, TEXTWORLD, TEXTWORLD_SYNC, MDP)}
)
