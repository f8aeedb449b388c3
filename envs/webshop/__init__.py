"""WebShop (Yao et al., 2022): a faithful text-mode re-implementation over the 1,000-product catalogue."""

from envs.webshop.catalogue import Catalogue, Product, load_catalogue
from envs.webshop.env import MAX_STEPS, SUCCESS_REWARD, WebShopEnv, WebShopState
from envs.webshop.goals import Goal, World, build_world
from envs.webshop.oracle import oracle_action
from envs.webshop.pages import Page
from envs.webshop.reward import RewardInfo, get_reward
from envs.webshop.search import SearchEngine, analyze
from envs.webshop.shop import Shop, load_shop

__all__ = [
    "MAX_STEPS",
    "SUCCESS_REWARD",
    "Catalogue",
    "Goal",
    "Page",
    "Product",
    "RewardInfo",
    "SearchEngine",
    "Shop",
    "WebShopEnv",
    "WebShopState",
    "World",
    "analyze",
    "build_world",
    "get_reward",
    "load_catalogue",
    "load_shop",
    "oracle_action",
]
