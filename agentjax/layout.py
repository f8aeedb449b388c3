"""The one legend of layout letters used in array names, einsum strings and jaxtyping shapes.

Array names carry their layout as a suffix (``reward_grt``, ``act_btd``, ``q_weight_dnh``) and a time index
where it matters (``v_t``, ``v_tp1``, ``adv_t``), as in rlax and flax's gemma example. Every jaxtyping shape
string in the package is written in these letters:

==== ===========================================================
B    batch (rows of a :class:`~agentjax.rollout.StepBatch`, sequences of the model)
G    group: the rollouts of one task from one reset state
R    rollout within a group
T    step (policy turn) within a rollout
M    a flattened visit index ``r * T + t`` inside one group (M = R * T)
S    state of an empirical process (distinct anchors of a group, capacity M)
Br   SERO oracle branch (``b`` in array names)
J    oracle step of a SERO branch
C    rubric criterion of a SERA node
K    tree of a SERA root task / history length for HGPO keys
Q    node of a SERA tree
L    token length
D    model width
N    query heads
H    head dim
V    vocabulary
F    MLP width
E    edge of a token trie (constrained decoding; its nodes are Q)
A    allowed token of a constrained response position (the choices the constrained decoder had)
==== ===========================================================
"""

LETTERS = {
    "B": "batch",
    "G": "group",
    "R": "rollout",
    "T": "step",
    "M": "visit (r * T + t)",
    "S": "state",
    "Br": "oracle branch",
    "J": "oracle step",
    "C": "rubric criterion",
    "K": "tree / history length",
    "Q": "tree node",
    "L": "token length",
    "D": "model width",
    "N": "query heads",
    "H": "head dim",
    "V": "vocabulary",
    "F": "mlp width",
    "E": "trie edge",
    "A": "allowed token",
}
