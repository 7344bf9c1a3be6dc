"""WebShop as a text env: search a shop, open products, choose options, buy.

Pages and actions follow WebShop (Yao et al. 2022, github.com/princeton-nlp/WebShop):

- search page: `search[query]`;
- results (10 per page of the top 50): products as `[asin] title | price`, and
  `[Back to Search]`, `[Next >]`, `[< Prev]`;
- item page: title, price, option groups whose values are clickable, `[Description]`,
  `[Features]`, `[< Prev]`, `[Back to Search]`, `[Buy Now]`;
- the Description / Features sub-pages: their text, `[< Prev]`, `[Back to Search]`.

An action is `search[...]` or `click[...]` inside the env's `action_pattern`
(`<answer>click[buy now]</answer>`). Every clickable element of a page is written in
square brackets in its observation (WebShop's `available_actions`, also in
`info["available_actions"]`); clicks match case-insensitively. A click on anything
else, a search where the page has no search bar, or text that names no action is an
invalid action: nothing changes and the reward is the format penalty. `Buy Now` ends
the episode with WebShop's reward (envs.webshop_data.reward); success is reward 1
(plus training-only shapings, 0 by default: `success_bonus` and `option_bonus` at the
purchase, `option_click_bonus` at the option click).
"""

from __future__ import annotations

import dataclasses
import re
import string
from typing import Dict, List, Optional, Tuple

import numpy as np

from envs import base, parsing, webshop_catalog, webshop_data
from envs.registry import register_env

BACK_TO_SEARCH, NEXT_PAGE, PREV_PAGE = "Back to Search", "Next >", "< Prev"
BUY_NOW, SUB_PAGES = "Buy Now", ("Description", "Features")
MAX_QUERY_CHARS = 256  # a longer search[...] is an invalid action
_ACTION = re.compile(r"\s*(search|click)\s*\[(.*)\]\s*", re.IGNORECASE | re.DOTALL)


@dataclasses.dataclass
class WebShopConfig(base.TextEnvConfig):
  max_steps: int = 15  # as in the GiGPO / verl-agent WebShop setups
  format_penalty: float = -0.1
  # WebShop's original files (items_shuffle*.json, items_ins_v2*.json, and with
  # human_goals items_human_ins*.json); None: the synthetic catalog that ships.
  data_dir: Optional[str] = None
  human_goals: bool = False  # goals from the human instructions (needs data_dir)
  num_products: int = 3000  # synthetic catalog size; with data_dir, the first N (0 = all)
  catalog_seed: int = 0  # the synthetic catalog's seed
  split: str = "train"  # goals of train or validation products (disjoint), or all
  results_per_page: int = 10  # WebShop: 10
  max_title_chars: int = 0  # titles cut to this many characters on results pages; 0 = whole
  # added to the reward of a purchase that scores 1 (a success); 0: WebShop's reward alone.
  # A training-only shaping: verl-agent trains on 10 x success alone, which a policy that
  # rarely succeeds gets no signal from; the score plus a bonus keeps the partial credit
  # and still sets a full match apart from a near one. Validation envs leave it at 0.
  success_bonus: float = 0.0
  # added to a purchase's reward times r_type x the share of the goal's options chosen
  # right. A training-only shaping: in WebShop's reward an option is one term of ~6, less
  # than the discount and the loop risk of the click that earns it, so RL learns to buy
  # at once; this pays a right click on a product of the goal's type by itself.
  option_bonus: float = 0.0
  # paid at the option click itself: option_click_bonus x r_type x the rise of the share of
  # the goal's options chosen right over the best share this episode reached (so at most
  # option_click_bonus an episode, and a re-click or a re-opened product pays nothing).
  # A training-only shaping: option_bonus, paid at the purchase, reaches a click only
  # through the later steps' returns, and a policy that buys at once stops clicking
  # options before a right click earns more than a wrong one; this pays the right click
  # on the step that makes it, where GiGPO compares it with the other steps on that page.
  # (configs/webshop.py records what it did: it did not keep option clicks either.)
  option_click_bonus: float = 0.0


@register_env("WebShop")
class WebShop(base.TextEnv):
  Config = WebShopConfig
  MAX_OBSERVATION_CHARS = 16384

  def __init__(self, config: Optional[WebShopConfig] = None, render_mode=None):
    super().__init__(config, render_mode)
    cfg = self.config
    if cfg.data_dir:
      self.catalog = webshop_data.load_catalog(cfg.data_dir, cfg.human_goals,
                                               cfg.num_products or None)
    else:
      self.catalog = webshop_catalog.synthetic_catalog(cfg.num_products, cfg.catalog_seed)
    self._goals = self.catalog.goals(cfg.split)
    if not self._goals:
      raise ValueError(f"WebShop split {cfg.split!r} of {self.catalog.source} has no goals")
    self.goal: Optional[webshop_data.Goal] = None
    self.page = "search"
    self.keywords = ""
    self.results: List[str] = []
    self.result_page = 1
    self.asin: Optional[str] = None
    self.chosen: Dict[str, str] = {}
    self.last_reward_info: Dict[str, float] = {}
    self.option_credit = 0.0  # the best r_type x r_options reached this episode
    self.action_kind: Optional[str] = None

  def check_config(self) -> None:
    cfg = self.config
    if cfg.split not in ("train", "validation", "all"):
      raise ValueError(f"WebShop split must be train, validation or all, got {cfg.split!r}")
    if cfg.results_per_page < 1:
      raise ValueError(f"WebShop results_per_page must be >= 1, got {cfg.results_per_page}")
    if cfg.success_bonus < 0:
      raise ValueError(f"WebShop success_bonus must be >= 0, got {cfg.success_bonus}")
    for key in ("option_bonus", "option_click_bonus"):
      if getattr(cfg, key) < 0:
        raise ValueError(f"WebShop {key} must be >= 0, got {getattr(cfg, key)}")
    if cfg.human_goals and not cfg.data_dir:
      raise ValueError("WebShop human_goals needs data_dir (the original "
                       "items_human_ins.json)")

  def observation_charset(self) -> str:
    return string.printable + "›|$"

  # -- the episode ------------------------------------------------------------
  def _new_episode(self, seed: int) -> None:
    rng = np.random.default_rng(seed)
    self.goal = self._goals[int(rng.integers(len(self._goals)))]
    self.page, self.keywords, self.results, self.result_page = "search", "", [], 1
    self.asin, self.chosen, self.last_reward_info = None, {}, {}
    self.option_credit = 0.0

  @property
  def instruction(self) -> str:
    return self.goal.instruction

  @property
  def product(self) -> Optional[webshop_data.Product]:
    return self.catalog.by_asin.get(self.asin) if self.asin else None

  def clickables(self) -> List[str]:
    """The page's clickable elements, as the observation shows them."""
    if self.page == "search":
      return []
    if self.page == "results":
      out = [BACK_TO_SEARCH]
      if self.result_page > 1:
        out.append(PREV_PAGE)
      if self.result_page * self.config.results_per_page < len(self.results):
        out.append(NEXT_PAGE)
      return out + self._page_asins()
    if self.page == "item":
      values = [v for vs in self.product.options.values() for v in vs]
      return [BACK_TO_SEARCH, PREV_PAGE, *SUB_PAGES, *values, BUY_NOW]
    return [BACK_TO_SEARCH, PREV_PAGE]  # a sub-page

  def available_actions(self) -> Dict[str, object]:
    return {"has_search_bar": self.page == "search", "clickables": self.clickables()}

  def _page_asins(self) -> List[str]:
    n = self.config.results_per_page
    return self.results[(self.result_page - 1) * n:self.result_page * n]

  def parse(self, action_text) -> Optional[str]:
    """`search[query]` (on the search page) or `click[element]` (an element the page
    shows, case-insensitive) in canonical form, else None."""
    answer = parsing.extract_answer(action_text, self.config.action_pattern)
    action = _ACTION.fullmatch(answer) if answer is not None else None
    if action is None:
      return None
    verb, argument = action.group(1).lower(), " ".join(action.group(2).split())
    if verb == "search":
      ok = self.page == "search" and argument and len(argument) <= MAX_QUERY_CHARS
      return f"search[{argument}]" if ok else None
    for element in self.clickables():
      if argument.lower() == element.lower():
        return f"click[{element}]"
    return None

  def _apply(self, action: str) -> Tuple[float, bool, bool]:
    verb, argument = action[:-1].split("[", 1)
    self.action_kind = action_kind(self.page, verb, argument)
    if verb == "search":
      self.keywords = argument
      self.results = self.catalog.search(argument)
      self.page, self.result_page = "results", 1
      return 0.0, False, False
    if argument == BACK_TO_SEARCH:
      self.page, self.asin, self.chosen = "search", None, {}
    elif argument == NEXT_PAGE:
      self.result_page += 1
    elif argument == PREV_PAGE:
      if self.page == "results":
        self.result_page -= 1
      elif self.page == "item":
        self.page, self.asin, self.chosen = "results", None, {}
      else:
        self.page = "item"
    elif self.page == "results":  # a product
      self.page, self.asin, self.chosen = "item", argument, {}
    elif argument in SUB_PAGES:
      self.page = argument
    elif argument == BUY_NOW:
      reward, self.last_reward_info = webshop_data.reward(
          self.product, self.goal, self.catalog.by_asin[self.goal.asin], self.chosen)
      success = reward >= 1.0 - 1e-9
      terms, cfg = self.last_reward_info, self.config
      shaping = ((cfg.success_bonus if success else 0.0)
                 + cfg.option_bonus * terms["r_type"] * terms["r_options"])
      return float(reward) + shaping, True, success
    else:  # an option value: selects it in its group
      group = next(g for g, vs in self.product.options.items() if argument in vs)
      self.chosen[group] = argument
      if self.config.option_click_bonus:
        return self._option_click_reward(), False, False
    return 0.0, False, False

  def _option_click_reward(self) -> float:
    terms = webshop_data.reward(self.product, self.goal, self.catalog.by_asin[self.goal.asin],
                                self.chosen)[1]
    credit = terms["r_type"] * terms["r_options"]
    gain, self.option_credit = credit - self.option_credit, max(credit, self.option_credit)
    return self.config.option_click_bonus * max(gain, 0.0)

  def step(self, action_text):
    obs, reward, terminated, truncated, info = super().step(action_text)
    info["available_actions"] = self.available_actions()
    info["action_kind"] = self.action_kind if info["action_is_valid"] else None
    if terminated:
      info["reward_terms"] = dict(self.last_reward_info)
    return obs, reward, terminated, truncated, info

  # -- rendering ----------------------------------------------------------------
  def render_text(self) -> str:
    lines = [f"Instruction: {self.goal.instruction}"]
    if self.page == "search":
      lines.append("[Search]")
    elif self.page == "results":
      total = len(self.results)
      pages = max(1, -(-total // self.config.results_per_page))
      lines.append(f"Results for {self.keywords} (page {self.result_page} of {pages}, "
                   f"{total} products)")
      buttons = [BACK_TO_SEARCH] + [b for b in (PREV_PAGE, NEXT_PAGE) if b in self.clickables()]
      lines.append(" ".join(f"[{b}]" for b in buttons))
      cut = self.config.max_title_chars
      for asin in self._page_asins():
        product = self.catalog.by_asin[asin]
        title = product.title[:cut] if cut else product.title
        lines.append(f"[{asin}] {title} | {product.price_tag}")
    elif self.page == "item":
      product = self.product
      lines.append(f"[{BACK_TO_SEARCH}] [{PREV_PAGE}]")
      lines.append(f"{product.title} | Price: {product.price_tag}")
      for group, values in product.options.items():
        shown = " ".join(f"[{v}]" for v in values)
        picked = f" (chosen: {self.chosen[group]})" if group in self.chosen else ""
        lines.append(f"{group}: {shown}{picked}")
      lines.append(" ".join(f"[{b}]" for b in (*SUB_PAGES, BUY_NOW)))
    else:
      product = self.product
      lines.append(f"[{BACK_TO_SEARCH}] [{PREV_PAGE}]")
      lines.append(product.description if self.page == "Description"
                   else "\n".join(product.features))
    return "\n".join(lines)

  def render_rgb(self) -> np.ndarray:
    return base.text_to_rgb(self.render_text())

  @property
  def instructions(self) -> str:
    return ("You are shopping on WebShop for the item the instruction describes. On the "
            "search page, search with <answer>search[your keywords]</answer>. On other "
            "pages, click an element shown in square brackets with "
            "<answer>click[element]</answer>: a product id to open it, an option value to "
            "choose it, Buy Now to buy the open product with the chosen options.")

  def sample_valid_response(self, rng: np.random.Generator) -> str:
    """A uniformly random valid action: on the search page a search for a span of the
    instruction's words, its length uniform from one word to all of them, elsewhere a
    uniformly random clickable."""
    if self.page == "search":
      words = self.goal.instruction.split()
      k = int(rng.integers(1, len(words) + 1))
      start = int(rng.integers(0, len(words) - k + 1))
      return f"<answer>search[{' '.join(words[start:start + k])}]</answer>"
    clickables = self.clickables()
    return f"<answer>click[{clickables[int(rng.integers(len(clickables)))].lower()}]</answer>"


def action_kind(page: str, verb: str, argument: str) -> str:
  """What a valid action does: `search`, open a `product`, choose an `option`, `buy`, or
  `navigate` (result pages, sub-pages, back). The shares of these show what a policy does
  on item pages, where success is decided and the verb alone (`click`) says nothing."""
  if verb == "search":
    return "search"
  if argument in (BACK_TO_SEARCH, NEXT_PAGE, PREV_PAGE, *SUB_PAGES):
    return "navigate"
  if argument == BUY_NOW:
    return "buy"
  return "product" if page == "results" else "option"


def oracle_response(env: WebShop) -> str:
  """An oracle's next action (it reads the goal): search the instruction, open the first
  result the goal's product-type and attributes fit (the goal's own product if listed),
  choose the goal's options, buy; `Next >` while no result fits."""
  goal = env.goal
  if env.page == "search":
    return f"<answer>search[{goal.instruction}]</answer>"
  if env.page == "results":
    target = env.catalog.by_asin[goal.asin]
    page = env._page_asins()
    for asin in page:
      product = env.catalog.by_asin[asin]
      chosen = _options_for(product, goal)
      if asin == goal.asin or webshop_data.reward(product, goal, target, chosen)[0] >= 1.0:
        return f"<answer>click[{asin}]</answer>"
    if NEXT_PAGE in env.clickables():
      return f"<answer>click[{NEXT_PAGE}]</answer>"
    return f"<answer>click[{page[0] if page else BACK_TO_SEARCH}]</answer>"
  if env.page == "item":
    for group, value in _options_for(env.product, goal).items():
      if env.chosen.get(group) != value:
        return f"<answer>click[{value}]</answer>"
    return f"<answer>click[{BUY_NOW}]</answer>"
  return f"<answer>click[{PREV_PAGE}]</answer>"


def shopper_response(env: WebShop, rng: np.random.Generator) -> str:
  """A random shopper's next action: the shop's procedure with every choice uniformly
  random, never reading the goal: search a random span of the instruction (as
  `sample_valid_response`), open a random listed product, choose a random value in each
  option group, in the page's order, then buy (`< Prev` off a sub-page). Its transcripts
  teach a warm start how shopping goes (options, then Buy Now), not what to buy."""
  if env.page == "search":
    return env.sample_valid_response(rng)
  if env.page == "results":
    listed = env._page_asins()
    choice = listed[int(rng.integers(len(listed)))] if listed else BACK_TO_SEARCH
    return f"<answer>click[{choice.lower()}]</answer>"
  if env.page == "item":
    for group, values in env.product.options.items():
      if group not in env.chosen:
        return f"<answer>click[{values[int(rng.integers(len(values)))].lower()}]</answer>"
    return f"<answer>click[{BUY_NOW.lower()}]</answer>"
  return f"<answer>click[{PREV_PAGE.lower()}]</answer>"


def _options_for(product: webshop_data.Product, goal: webshop_data.Goal) -> Dict[str, str]:
  wanted = {o.lower() for o in goal.options}
  return {g: v for g, vs in product.options.items() for v in vs if v in wanted}
