"""TextWorld-Sync on tw-cooking (env ``textworld_cooking_sync``): the project's own multi-agent, multi-dish
CookingWorld on one shared world (SERA App. C; METHODS.md), a second, harder variant of SERA's benchmark. The
released benchmark itself, on the authors' small engine, is :mod:`envs.textworld_sync`; numbers comparable with the
paper come only from that one.

Modules: data (CookingWorld's vocabulary), state (the world as plain data), rules (commands, admissible lists,
score), text (what agents read), world (the locked shared world and its agents), generate (seven task families,
four difficulties), manifest (the fixed splits), env (the Env wrapper and agent handles), planner (the oracle, for
one agent or a team), verifier (structured subtask goals), twcheck (the cross-check against TextWorld's engine).

What was checked against TextWorld (twcheck.py, tests/envs/test_textworld_cooking_sync.py, the benchmark): on tw-cooking
games, the walkthrough wins in the equivalent Sync world with TextWorld's score; along walkthroughs and random walks
the admissible commands, executability, score, won and lost equal TextWorld's logic engine at every step, and the
feedback of take/drop/put/insert/open/close/eat/cook/cut/prepare/inventory/cookbook equals the compiled game's text.

Deviations from CookingWorld (TextWorld 1.7.0 ``tw-cooking``), each on purpose:

- several dishes: ``prepare <dish>`` / ``eat <dish>`` by the dish's name (one dish called "meal" is CookingWorld's
  ``prepare meal``); the cookbook lists one recipe card per dish; a wrong processing of any dish's ingredient loses
  the world (every dish is needed for the root task), each eaten dish scores as partial progress;
- several agents with their own room, history and step budget on one state (world.py), one shared inventory by
  default, or one per agent;
- locks and keys on doors and containers (TextWorld's standard ``lock``/``unlock`` rules; CookingWorld has none) and
  lockable storage furniture in rooms (chest, cabinet, locker, ...), used by the task families;
- room descriptions from one deterministic template, not CookingWorld's random grammar; short factual texts when
  examining furniture, doors, the knife or keys (foods and the cookbook read as in CookingWorld);
- ``prepare D`` is admissible once every ingredient of D is carried (TextWorld: once the first one is);
- commands are matched case-insensitively in TextWorld's canonical forms only (Inform 7 also parses synonyms such
  as "get", "x", "cook X in oven"); ``take X`` also works for an item on a supporter or in an open container;
- no inventory limit (tw-cooking's ``--drop``), and CookingWorld's food splits are not used: every split draws from
  all 38 foods (splits differ by seed);
- the start room is random among the rooms not behind a locked door.
"""

from envs.textworld_cooking_sync.env import ROOT, AgentHandle, SyncSnapshot, TextWorldCookingSyncEnv, world_state
from envs.textworld_cooking_sync.generate import DIFFICULTIES, FAMILIES, LEVELS, generate, solvable
from envs.textworld_cooking_sync.manifest import SPLIT_SIZES
from envs.textworld_cooking_sync.planner import Blocked, TeamOracle, Unsolvable, assign, next_command, plan
from envs.textworld_cooking_sync.rules import admissible, execute
from envs.textworld_cooking_sync.state import WorldState
from envs.textworld_cooking_sync.verifier import KINDS, Verdict, check, describe, subgoals, verify
from envs.textworld_cooking_sync.world import StepResult, World, replay

__all__ = [
    "DIFFICULTIES",
    "FAMILIES",
    "KINDS",
    "LEVELS",
    "ROOT",
    "SPLIT_SIZES",
    "AgentHandle",
    "Blocked",
    "StepResult",
    "SyncSnapshot",
    "TeamOracle",
    "TextWorldCookingSyncEnv",
    "Unsolvable",
    "Verdict",
    "World",
    "WorldState",
    "admissible",
    "assign",
    "check",
    "describe",
    "execute",
    "generate",
    "next_command",
    "plan",
    "replay",
    "solvable",
    "subgoals",
    "verify",
    "world_state",
]
