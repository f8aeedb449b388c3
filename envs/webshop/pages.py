"""WebShop's pages in text mode: the page state, the ``[SEP]``-joined text and the clickables, as the original shows.

The original renders HTML templates (princeton-nlp/WebShop ``web_agent_site/templates/*.html``) and its text mode
(``WebAgentTextEnv.convert_html_to_text(simple=True)``) joins the stripped visible strings with `` [SEP] ``;
``get_available_actions`` lists the clickables: the buttons and product links by their lower-cased text, then the
option radio buttons by their value, in page order (a later duplicate replaces an earlier one's target but keeps its
place). Pages here (``instr`` the goal's instruction text)::

    search    WebShop [SEP] Instruction: [SEP] instr [SEP] Search                             search bar; search
    results   Instruction: [SEP] instr [SEP] Back to Search [SEP] Page 2 (Total results: 50) [SEP] < Prev [SEP]
              Next > [SEP] B0.. [SEP] title [SEP] $price [SEP] ...  (10 a page; < Prev from page 2; Next > always)
    item      Instruction: [SEP] instr [SEP] Back to Search [SEP] < Prev [SEP] size [SEP] small [SEP] large [SEP]
              ... [SEP] title [SEP] Price: $p [SEP] Rating: N.A. [SEP] Description [SEP] Features [SEP] Reviews
              [SEP] Buy Now                 (option names and values in page order; chosen options are not shown)
    Description / Features / Reviews: Instruction: [SEP] instr [SEP] Back to Search [SEP] < Prev [SEP] the text /
              one part per bullet point / per review: "title", score, body
    done      Thank you for shopping with us! [SEP] ... [SEP] Your score (min 0.0, max 1.0) [SEP] 0.5 [SEP] ...

A string is shown as the HTML parser would give it: an empty value adds nothing, a value of ASCII white space
without a newline adds an empty part (BeautifulSoup collapses it to one space, which strips to ""), one with a
newline adds nothing. The text of every page kind was checked against the original templates rendered with jinja2
and read back with BeautifulSoup 4.12 on this catalogue (not a test dependency; see the tests' docstring).

A :class:`Page` is the whole browsing state (the original's session: keywords, results page, product, chosen
options, sub-page); pages are values, so snapshots are exact.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping
from typing import Literal

from envs.webshop.catalogue import Product

PRODUCT_WINDOW = 10  # results per page
END_BUTTON, NEXT_PAGE, PREV_PAGE, BACK_TO_SEARCH = "Buy Now", "Next >", "< Prev", "Back to Search"
SUB_PAGES = ("Description", "Features", "Reviews")  # the original's Attributes page is off (show_attrs=False)
SEARCH_BUTTON = "search"
_ASCII_SPACE = " \t\n\r\f"

PageKind = Literal["search", "results", "item", "sub", "done"]


@dataclasses.dataclass(frozen=True)
class Clickable:
    """What a click does: a button (by label), a product link (by ASIN) or an option radio (by option name)."""

    kind: Literal["button", "product", "option"]
    target: str  # the button's label, the product's ASIN, or the option's name


@dataclasses.dataclass(frozen=True)
class Page:
    """The browsing state: which page is shown and the session fields it depends on."""

    kind: PageKind
    keywords: str | None = None  # the last search, as typed (lower-cased)
    page: int = 1  # the results page the product was opened from
    asin: str | None = None  # the product open on item / sub / done pages
    options: tuple[tuple[str, str], ...] = ()  # chosen (option name, value), in the order first chosen
    sub: str | None = None  # "Description" / "Features" / "Reviews" on a sub page
    score: float | None = None  # the task score, on the done page

    def with_option(self, name: str, value: str) -> Page:
        chosen = dict(self.options)
        chosen[name] = value
        return dataclasses.replace(self, options=tuple(chosen.items()))


@dataclasses.dataclass(frozen=True)
class View:
    """A page as text mode shows it, without the instruction lines, and its clickables."""

    parts: tuple[str, ...]  # the [SEP] parts after "Instruction: [SEP] instr" (all of them on the done page)
    clickables: Mapping[str, Clickable]  # lower-cased text (or option value) -> what a click does, in page order
    has_search_bar: bool = False


def node(text: str) -> tuple[str, ...]:
    """The text-mode parts of one HTML text node (module docstring)."""
    if not text:
        return ()
    if not text.strip(_ASCII_SPACE):
        return () if "\n" in text else ("",)
    return (text.strip(),)


def _buttons(*labels: str) -> dict[str, Clickable]:
    return {label.lower(): Clickable("button", label) for label in labels}


SEARCH_VIEW = View(parts=("Search",), clickables=_buttons("Search"), has_search_bar=True)


def results_view(products: tuple[Product, ...], page: int, total: int) -> View:
    """Results page ``page`` (1-based) showing ``products`` (that page's slice) of ``total`` results."""
    parts = [BACK_TO_SEARCH, f"Page {page} (Total results: {total})"]
    nav = [PREV_PAGE, NEXT_PAGE] if page > 1 else [NEXT_PAGE]
    parts += nav
    clickables = _buttons(BACK_TO_SEARCH, *nav)
    for p in products:
        parts += [*node(p.asin), *node(p.title), *node(p.price_tag)]
    for p in products:
        clickables[p.asin.lower()] = Clickable("product", p.asin)
    return View(parts=tuple(parts), clickables=clickables)


@functools.lru_cache(maxsize=1 << 12)
def item_view(product: Product) -> View:
    """The item page of ``product`` (the same whatever options are chosen)."""
    parts = [BACK_TO_SEARCH, PREV_PAGE]
    for name, values in product.options:
        parts += node(name)
        for v in values:
            parts += node(v)
    parts += [*node(product.title), *node(f"Price: {product.price_tag}"), *node(f"Rating: {product.rating}")]
    parts += [*SUB_PAGES, END_BUTTON]
    clickables = _buttons(BACK_TO_SEARCH, PREV_PAGE, *SUB_PAGES, END_BUTTON)
    for name, values in product.options:
        for v in values:
            clickables[v] = Clickable("option", name)
    return View(parts=tuple(parts), clickables=clickables)


@functools.lru_cache(maxsize=1 << 12)
def sub_view(product: Product, sub: str) -> View:
    """The Description, Features or Reviews page of ``product``."""
    parts = [BACK_TO_SEARCH, PREV_PAGE]
    if sub == "Description":
        parts += node(product.description)
    elif sub == "Features":
        for bullet in product.bullet_points:
            parts += node(f" {bullet}")
    elif sub == "Reviews":
        for r in product.reviews:
            parts += [*node(f'"{r.title}"'), *node(str(r.score)), *node(r.body)]
    else:
        raise ValueError(f"no sub page {sub!r}; one of {SUB_PAGES}")
    return View(parts=tuple(parts), clickables=_buttons(BACK_TO_SEARCH, PREV_PAGE))


def _tojson(value: object) -> str:
    """Flask 2's ``tojson`` filter: sorted keys, ASCII, HTML-special characters as \\u escapes."""
    text = json.dumps(value, sort_keys=True, ensure_ascii=True)
    for ch, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("'", "\\u0027")):
        text = text.replace(ch, esc)
    return text


def done_view(asin: str, options: tuple[tuple[str, str], ...], score: float) -> View:
    """The page after Buy Now (its hidden debugging fields are visible text too, as in the original)."""
    parts = [
        "Thank you for shopping with us!", "Your code:", "None", "(Paste it in your MTurk interface.)",
        "Purchased", "asin", *node(asin), "options", _tojson(dict(options)),
        "attrs", "None", "category", "None", "query", "None", "product category", "None",
        "Target", "asin", "options", "attrs", "price upper", "instuction text", "category", "product category",
        "query", "Goal", "None", "Reward", "Your score (min 0.0, max 1.0)", str(score), "Reward Details", "None",
    ]  # fmt: skip
    return View(parts=tuple(parts), clickables={})


def raw_text(page: Page, view: View, instruction: str) -> str:
    """The original's text-mode observation of a page."""
    if page.kind == "done":
        return " [SEP] ".join(view.parts)
    head = ("WebShop", "Instruction:") if page.kind == "search" else ("Instruction:",)
    return " [SEP] ".join((*head, *node(instruction), *view.parts))


def agent_text(raw: str, task: str) -> str:
    """verl-agent's ``format_obs``: the parts after the task, each quoted, or the raw text when the task is absent."""
    parts = raw.split(" [SEP] ")
    try:
        index = parts.index(task)
    except ValueError:
        return raw
    return " [SEP] ".join(f"'{p}'" for p in parts[index + 1 :])


def admissible(view: View, search: str = "search[<your query>]") -> tuple[str, ...]:
    """verl-agent's available actions: ``search[<your query>]`` (or ``search``) with a search bar, then ``click[x]``
    per clickable (the search button left out: the original's step refuses ``click[search]``)."""
    actions = [search] if view.has_search_bar else []
    actions += [f"click[{c}]" for c in view.clickables if c != SEARCH_BUTTON]
    return tuple(actions)
