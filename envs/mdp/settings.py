"""The pre-registered settings of the credit testbed, by name: ``MDPEnv(setting="s1" | "s2" | "s3")``.

Copied from ``experiments/credit_testbed/results/preregistration.json`` (``settings.S*.selected.config``; chosen by
exact computation before any learning run, ``experiments/credit_testbed/README.md``);
``tests/envs/test_mdp_settings.py`` checks that they equal the JSON.

- ``s1``: a long horizon; the uniform policy succeeds now and then (median 7.5% over seeds 0..63), 34 steps.
- ``s2``: converging paths with slips, where the methods' credit accuracy differs most (median 32.7%), 14 steps.
- ``s3``: a lock; the uniform policy almost never reaches the goal (median 0.44%), 20 steps.
"""

from __future__ import annotations

import types
from collections.abc import Mapping

from envs.mdp.config import MDPConfig

SETTINGS: Mapping[str, MDPConfig] = types.MappingProxyType({
    "s1": MDPConfig(depth=16, width=3, dead_ends=0.1, loops=0.1),
    "s2": MDPConfig(depth=6, width=2, noise=0.2, dead_ends=0.15),
    "s3": MDPConfig(depth=4, width=3, lock=5),
})


def setting(name: str) -> MDPConfig:
    """The :class:`MDPConfig` of a pre-registered setting (module docstring); the name is case-insensitive."""
    key = name.lower()
    if key not in SETTINGS:
        raise ValueError(f"unknown mdp setting {name!r}; one of {sorted(SETTINGS)}")
    return SETTINGS[key]
