"""What every WebShop episode in a process shares: the catalogue, the world (hidden prices, goals), the search engine,
cached pages and the score of a purchase. The environment (:mod:`envs.webshop.env`) and the expert
(:mod:`envs.webshop.oracle`) both read it.
"""

from __future__ import annotations

import functools
import pathlib

from envs.webshop import pages
from envs.webshop.catalogue import Catalogue, Product, load_catalogue
from envs.webshop.goals import Goal, World, build_world
from envs.webshop.pages import Page, View
from envs.webshop.reward import RewardInfo, get_reward
from envs.webshop.search import SearchEngine


class Shop:
    """What every WebShop episode in a process shares: catalogue, prices, goals, search engine, cached pages."""

    def __init__(self, catalogue: Catalogue):
        self.catalogue = catalogue
        self.world: World = build_world(catalogue)
        self.engine = SearchEngine(catalogue)
        self.results = functools.lru_cache(maxsize=1 << 14)(self._results)

    def _results(self, keywords: str, page: int) -> View:
        hits = self.engine.search(keywords)
        window = hits[(page - 1) * pages.PRODUCT_WINDOW : page * pages.PRODUCT_WINDOW]
        return pages.results_view(tuple(self.catalogue.products[i] for i in window), page, len(hits))

    def view(self, page: Page) -> View:
        """The view of a page (cached per results page and per product)."""
        if page.kind == "search":
            return pages.SEARCH_VIEW
        if page.kind == "results":
            return self.results(page.keywords, page.page)
        product = self.catalogue.by_asin[page.asin]
        if page.kind == "item":
            return pages.item_view(product)
        if page.kind == "sub":
            return pages.sub_view(product, page.sub)
        return pages.done_view(page.asin, page.options, page.score)

    def product(self, asin: str) -> Product:
        return self.catalogue.by_asin[asin]

    def score(self, goal: Goal, asin: str, options: dict[str, str]) -> RewardInfo:
        """The reward of buying ``asin`` with ``options`` at its hidden price, for ``goal``."""
        return get_reward(
            self.product(asin),
            price=self.world.prices[asin],
            options=options,
            goal_attributes=goal.attributes,
            goal_options=goal.goal_options,
            price_upper=goal.price_upper,
            goal_query=goal.query,
            goal_category=goal.product_category,
            goal_name=goal.name,
        )


def load_shop(data_dir: str | pathlib.Path | None = None) -> Shop:
    """The shop over ``data_dir`` (default ``$AGENTJAX_DATA/webshop``), built once per process."""
    return _shop(load_catalogue(data_dir))


@functools.lru_cache(maxsize=4)
def _shop(catalogue: Catalogue) -> Shop:
    return Shop(catalogue)
