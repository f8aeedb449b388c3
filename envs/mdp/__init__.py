"""Credit-testbed MDPs: small text MDPs with a known model, generated from a seed and a setting of knobs, with
exact policy evaluation (V^π, Q^π, A^π for the capped episode) and an optimal-policy oracle.

Modules: config (the knobs, what each one does), settings (the pre-registered settings s1 / s2 / s3), generate
(the generator), model (the arrays), text (the observations and the word vocabulary), solve (exact evaluation,
value iteration, the random policy's success), env (the environment and its task splits).
"""

from envs.mdp.config import MAX_ACTIONS, MDPConfig
from envs.mdp.env import SPLITS, MDPEnv, MDPSnapshot, mdp_of
from envs.mdp.generate import generate_mdp
from envs.mdp.model import KINDS, MDP
from envs.mdp.settings import SETTINGS, setting
from envs.mdp.solve import (
    BETA,
    Evaluation,
    Optimal,
    evaluate,
    optimal,
    random_success,
    success_probability,
    uniform_policy,
)
from envs.mdp.text import INSTRUCTION, LABELS, split_words, vocabulary

__all__ = [
    "BETA",
    "INSTRUCTION",
    "KINDS",
    "LABELS",
    "MAX_ACTIONS",
    "MDP",
    "SETTINGS",
    "SPLITS",
    "Evaluation",
    "MDPConfig",
    "MDPEnv",
    "MDPSnapshot",
    "Optimal",
    "evaluate",
    "generate_mdp",
    "mdp_of",
    "optimal",
    "random_success",
    "setting",
    "split_words",
    "success_probability",
    "uniform_policy",
    "vocabulary",
]
