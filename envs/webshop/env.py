"""WebShop (Yao et al., 2022) in text mode: a faithful re-implementation of ``WebAgentTextEnv`` over the 1k catalogue.

The original (princeton-nlp/WebShop ``web_agent_site/envs/web_agent_text_env.py``) serves HTML pages from a
simulated Flask server and reads them back as text; this module keeps its behaviour and drops the HTML:

- Actions (``parse_action``: ``re.match(r"(.+)\\[(.+)\\]", action)``, the argument lower-cased):
  ``search[keywords]`` runs a search from *any* page (the original does not check for a search bar) and shows
  results page 1; ``click[x]`` acts when ``x`` is one of the page's clickables (:mod:`envs.webshop.pages`), except
  the search button. Anything else (not of the form ``name[arg]``, another name, a leading space, ``click[search]``,
  a click on something the page does not offer) is *invalid*: nothing changes but the step count
  (``info["valid"] = False``), as the original "performs nothing". Text after the closing bracket is ignored
  (``re.match``), as in the original.
- Clicks: ``Back to Search`` -> search page (the session is cleared); ``Next >`` / ``< Prev`` on results -> the
  next / previous results page (``Next >`` is always offered, past the last result too); a product -> its item page
  (no options chosen); an option value -> the same item page with that option chosen (one value per option name);
  ``Description`` / ``Features`` / ``Reviews`` -> that sub-page, whose ``< Prev`` returns to the item page with the
  options kept; ``< Prev`` on an item page -> the results page it came from; ``Buy Now`` -> the done page, the
  task score (:mod:`envs.webshop.reward`), and the end of the episode.
- 15 steps (verl-agent's WebShop budget, the base class's truncation).

Observation (``Obs``), as verl-agent builds it (``WebshopEnvironmentManager``): ``text`` = ``anchor`` = the page's
text-mode parts after the instruction, each quoted and joined by `` [SEP] `` (``'Back to Search' [SEP] 'Page 1
(Total results: 50)' [SEP] 'Next >' [SEP] 'B08ZRR3DZT' [SEP] 'SheIn Women...' [SEP] '$19.99 to $27.99' ...``; the
search page is ``'Search'``); ``instruction`` = the goal's instruction text (``Find me ... with color: black, and
size: small, and price lower than 30.00 dollars``); ``admissible`` = verl-agent's available actions
(``search[<your query>]`` on the search page, then ``click[<clickable>]`` per clickable, lower-cased, in page order).
:attr:`WebShopEnv.raw_observation` is the original's text (``WebShop [SEP] Instruction: [SEP] ... [SEP] Search``).
Chosen options are not visible in text mode (the original's ``simple`` mode), so two item pages with different
choices share a text and an anchor.

Reward: ``reward="success"`` (default, verl-agent): 10 when the score is 1, else 0; ``reward="score"``: the score.
``info`` carries ``task_score`` (the score on the buying step, else 0), ``won`` (score = 1) and, on the buying step,
``reward_info`` (the score's parts).

Tasks: WebShop's synthetic goals (:mod:`envs.webshop.goals`): ``test`` = goals 0-499, ``train`` = goals 500-6909, in
goal order; ``Task.meta`` holds the goal (:meth:`Goal.meta`), ``task_id`` = ``webshop-<goal index>``.

State and snapshots: the state is the :class:`~envs.webshop.pages.Page` and the history of actions (plus the step
count); :class:`WebShopState` holds them, is immutable and picklable, and restores exactly.

Deviations from the original, all listed (details in the modules named):

- no HTML: pages are rendered as text directly (:mod:`~envs.webshop.pages`; checked against the original templates);
  no ``html`` / ``text_rich`` / ``url`` observation modes, no images, no Attributes page (``show_attrs`` is off in
  the original's text env too);
- search: bm25s with Lucene's document-length encoding and an Anserini-style analyzer written here (regex
  tokenizer, Snowball's Porter stemmer), not pyserini/Lucene; the debugging prefixes ``<r>`` / ``<a>`` / ``<c>`` /
  ``<q>`` are plain words (:mod:`~envs.webshop.search`);
- goals: hidden prices and price bounds from ``random.Random(42)`` (the original: the unseeded global RNG), the
  product order of the data file taken as the original's (:mod:`~envs.webshop.goals`,
  :mod:`~envs.webshop.catalogue`); synthetic goals only (the human-goal file is not available);
- reward: spaCy 3.8 / en_core_web_sm 3.8.0 (the original: 3.3), thefuzz 0.22 on rapidfuzz (the original: 0.19)
  (:mod:`~envs.webshop.reward`);
- ``click[search]`` is left out of the admissible list (verl-agent lists it; the original's step refuses it).

``search_query="instruction"`` (not verl-agent's; for policies that can only choose among the admissible actions,
e.g. the tiny presets' constrained decoding) lists ``search[<the instruction as a query>]`` instead of the
``search[<your query>]`` placeholder, which such a policy could only send verbatim: the query is the instruction
lower-cased with brackets removed (:func:`envs.webshop.oracle.clean_query`), which is also the expert's query whenever
its results hold the target (so SERO's oracle branches stay within the constrained policy's actions there).

Costs: the first environment of a process builds the shared :class:`~envs.webshop.shop.Shop` (catalogue, goals, BM25
index; about 1 s here); the first purchase of a process loads spaCy (several seconds); then a step is a dictionary
lookup or a cached search (about 1,000 steps/s with every query new, over 10,000 with caches warm;
``experiments/bench/env_webshop.py``).
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib
import re
from typing import Any, ClassVar, Literal

from envs.base import Env, Obs, Task, step_info
from envs.webshop import pages
from envs.webshop.catalogue import Catalogue, load_catalogue
from envs.webshop.goals import Goal, build_world, split_indices
from envs.webshop.oracle import clean_query, oracle_action
from envs.webshop.pages import Page, View
from envs.webshop.shop import load_shop

MAX_STEPS = 15
SUCCESS_REWARD = 10.0  # verl-agent: 10 for a purchase that scores 1
SPLITS = ("train", "test")
_ACTION = re.compile(r"(.+)\[(.+)\]")  # the original's parse_action pattern (re.match: a prefix match)
_SUB_PAGE = {s.lower(): s for s in pages.SUB_PAGES}


@dataclasses.dataclass(frozen=True)
class WebShopState:
    """An exact snapshot: the task, the page, the actions so far, the step count."""

    task: Task
    page: Page
    history: tuple[str, ...]  # every action taken, valid or not
    steps: int
    done: bool
    max_steps: int


class WebShopEnv(Env):
    """WebShop's text environment on the protocol of :class:`envs.base.Env` (module docstring)."""

    name: ClassVar[str] = "webshop"

    def __init__(
        self,
        *,
        max_steps: int = MAX_STEPS,
        reward: Literal["success", "score"] = "success",
        data_dir: str | pathlib.Path | None = None,
        search_query: Literal["placeholder", "instruction"] = "placeholder",
    ):
        super().__init__(max_steps)
        if reward not in ("success", "score"):
            raise ValueError(f"webshop: reward must be 'success' (10 for a score of 1) or 'score', got {reward!r}")
        if search_query not in ("placeholder", "instruction"):
            raise ValueError(f"webshop: search_query must be 'placeholder' (verl-agent's search[<your query>]) or "
                             f"'instruction' (the instruction as the listed query), got {search_query!r}")
        self.reward_mode = reward
        self.search_query = search_query
        self.shop = load_shop(data_dir)
        self.goal: Goal | None = None
        self.page = Page("search")
        self.history: tuple[str, ...] = ()

    # -- the protocol ----------------------------------------------------------------------------------------------
    def _reset(self, task: Task) -> Obs:
        self.goal = self._goal(task)
        self.page, self.history = Page("search"), ()
        return self._obs()

    def _step(self, action: str) -> tuple[Obs, float, bool, dict[str, Any]]:
        self.history = (*self.history, action)
        page = self._next_page(action)
        if page is None:
            info = step_info(won=False, truncated=False, valid=False, task_score=0.0)
            return self._obs(), 0.0, False, info
        if page.kind != "done":
            self.page = page
            return self._obs(), 0.0, False, step_info(won=False, truncated=False, valid=True, task_score=0.0)
        result = self.shop.score(self.goal, page.asin, dict(page.options))
        self.page = dataclasses.replace(page, score=result.score)
        won = result.score == 1.0
        reward = (SUCCESS_REWARD if won else 0.0) if self.reward_mode == "success" else result.score
        info = step_info(
            won=won, truncated=False, valid=True, task_score=result.score, reward_info=dataclasses.asdict(result)
        )
        return self._obs(), reward, True, info

    def snapshot(self) -> WebShopState:
        if self.task is None:
            raise RuntimeError("webshop: snapshot() before reset()")
        return WebShopState(self.task, self.page, self.history, self.steps, self.done, self.max_steps)

    def restore(self, snapshot: WebShopState) -> Obs:
        if not isinstance(snapshot, WebShopState):
            raise TypeError(f"webshop: restore() takes a WebShopState, got {type(snapshot).__name__}")
        if snapshot.task.env != self.name:
            raise ValueError(f"snapshot of env {snapshot.task.env!r}, not {self.name!r}")
        if snapshot.page.asin is not None and snapshot.page.asin not in self.shop.catalogue.by_asin:
            raise ValueError(f"webshop: snapshot shows product {snapshot.page.asin}, which is not in the catalogue")
        self.goal = self._goal(snapshot.task)
        self.task, self.page, self.history = snapshot.task, snapshot.page, snapshot.history
        self.steps, self.done, self.max_steps = snapshot.steps, snapshot.done, snapshot.max_steps
        return self._obs()

    def oracle(self) -> str:
        """The rule-based expert's next action (:mod:`envs.webshop.oracle`)."""
        if self.goal is None:
            raise RuntimeError("webshop: oracle() before reset()")
        return oracle_action(self.shop, self.goal, self.page)

    @classmethod
    def tasks(cls, split: str) -> list[Task]:
        """The fixed manifest of a split: ``test`` = goals 0-499, ``train`` = goals 500-6909, in goal order."""
        if split not in SPLITS:
            raise ValueError(f"webshop: unknown split {split!r}; splits are {SPLITS}")
        return list(_manifest(load_catalogue(), split))

    # -- views -----------------------------------------------------------------------------------------------------
    @property
    def view(self) -> View:
        return self.shop.view(self.page)

    @property
    def raw_observation(self) -> str:
        """The original's text-mode observation of the current page."""
        return pages.raw_text(self.page, self.view, self.goal.instruction_text)

    def _obs(self) -> Obs:
        view = self.view
        raw = pages.raw_text(self.page, view, self.goal.instruction_text)
        text = pages.agent_text(raw, self.goal.instruction_text.strip())
        search = "search[<your query>]"
        if self.search_query == "instruction":
            search = f"search[{clean_query(self.goal.instruction_text)}]"
        return Obs(text=text, anchor=text, admissible=pages.admissible(view, search),
                   instruction=self.goal.instruction_text)

    # -- the game --------------------------------------------------------------------------------------------------
    def _goal(self, task: Task) -> Goal:
        goal = Goal.from_meta(task.meta)
        if goal.asin not in self.shop.catalogue.by_asin:
            raise ValueError(f"webshop task {task.task_id!r}: its target {goal.asin} is not in the catalogue")
        return goal

    def _next_page(self, action: str) -> Page | None:
        """The page an action leads to (the original's ``step`` and ``SimServer.receive``), or None if invalid."""
        m = _ACTION.match(action)
        if m is None:
            return None
        kind, arg = m.group(1), m.group(2).lower()
        page = self.page
        if kind == "search":
            return Page("results", keywords=arg, page=1)
        if kind != "click" or arg == pages.SEARCH_BUTTON:
            return None
        clickable = self.view.clickables.get(arg)
        if clickable is None:
            return None
        if arg == pages.END_BUTTON.lower():
            return Page("done", keywords=page.keywords, page=page.page, asin=page.asin, options=page.options)
        if arg == pages.BACK_TO_SEARCH.lower():
            return Page("search")
        if arg == pages.NEXT_PAGE.lower() and page.kind == "results":
            return dataclasses.replace(page, page=page.page + 1)
        if arg == pages.PREV_PAGE.lower() and page.kind == "results":
            return dataclasses.replace(page, page=page.page - 1)
        if arg == pages.PREV_PAGE.lower() and page.kind == "sub":
            return dataclasses.replace(page, kind="item", sub=None)
        if arg == pages.PREV_PAGE.lower() and page.kind == "item":
            return Page("results", keywords=page.keywords, page=page.page)
        if arg in _SUB_PAGE:
            return dataclasses.replace(page, kind="sub", sub=_SUB_PAGE[arg])
        if clickable.kind == "product":
            return Page("item", keywords=page.keywords, page=page.page, asin=clickable.target)
        if clickable.kind == "option":
            return dataclasses.replace(page, kind="item").with_option(clickable.target, arg)
        return None  # a button with no action here (cannot happen with the original's pages)


@functools.lru_cache(maxsize=8)
def _manifest(catalogue: Catalogue, split: str) -> tuple[Task, ...]:
    goals = build_world(catalogue).goals
    return tuple(
        Task(env=WebShopEnv.name, task_id=f"webshop-{i}", split=split, seed=i, meta=goals[i].meta())
        for i in split_indices(split, len(goals))
    )
