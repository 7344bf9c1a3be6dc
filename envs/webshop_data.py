"""WebShop's data: products, goals (instructions), the BM25 search engine, and the reward.

WebShop (Yao et al. 2022, "WebShop: Towards Scalable Real-World Web Interaction with
Grounded Language Agents", github.com/princeton-nlp/WebShop) ships 1.18M scraped
products and a Lucene index that a fresh machine cannot download. Two sources fill the
same `Catalog`:

- `synthetic_catalog(num_products, seed)` (envs.webshop_catalog): a deterministic
  generator of products over ten categories, written in WebShop's own file format
  (`items_shuffle.json` records and `items_ins_v2.json` instructions), so one loader
  (`catalog_from_records`) reads both;
- `load_catalog(data_dir)`: the original files, where a user has them
  (`items_shuffle*.json`, `items_ins_v2*.json`, and `items_human_ins.json` for
  `human_goals`).

Goals are split by product: validation goals come from products that no training goal
names. Search is BM25 (the `bm25s` library) over each product's title, features,
description and option values, built once per catalog and cached on disk.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import hashlib
import json
import os
import re
import shutil
import zlib
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

SEARCH_RETURN_N = 50  # WebShop's search returns the top 50 products
PRICE_RANGE = [10.0 * i for i in range(1, 100)]  # WebShop's goal price bounds
# Option groups matched exactly in the reward (WebShop: "size"); others fuzzily.
EXACT_MATCH_OPTIONS = ("size",)
FUZZY_THRESHOLD = 85  # WebShop: rapidfuzz/thefuzz token_set_ratio > 85 is a match
VALIDATION_SHARE = 0.1  # of products whose goals are validation goals


@dataclasses.dataclass(frozen=True)
class Product:
  asin: str
  title: str
  category: str  # WebShop's short category ("grocery")
  query: str  # the search query the product was collected under
  product_category: str  # breadcrumb, "A › B › C"
  description: str
  features: Tuple[str, ...]  # WebShop's bullet points
  attributes: Tuple[str, ...]
  options: Mapping[str, Tuple[str, ...]]  # option group -> values (lower case)
  price: float  # what the shop charges (a price range is drawn once, by asin)
  price_tag: str  # as the page shows it: "$12.99" or "$10.0 to $20.0"

  def text(self) -> str:
    """What the search engine indexes."""
    values = " ".join(v for vs in self.options.values() for v in vs)
    return " ".join([self.title, " ".join(self.features), self.description, values])


@dataclasses.dataclass(frozen=True)
class Goal:
  asin: str  # the product the instruction was written from
  instruction: str
  attributes: Tuple[str, ...]
  options: Tuple[str, ...]  # option values the buyer asks for
  price_upper: float


@dataclasses.dataclass
class Catalog:
  products: List[Product]
  train_goals: List[Goal]
  validation_goals: List[Goal]
  source: str  # "synthetic:N:seed" or the data directory

  def __post_init__(self):
    self.by_asin = {p.asin: p for p in self.products}
    self._search = None

  def goals(self, split: str) -> List[Goal]:
    if split == "train":
      return self.train_goals
    if split == "validation":
      return self.validation_goals
    if split == "all":
      return self.train_goals + self.validation_goals
    raise ValueError(f"WebShop split must be train, validation or all, got {split!r}")

  def search(self, query: str, k: int = SEARCH_RETURN_N) -> List[str]:
    """The asins of the top-k products for `query`, best first."""
    if self._search is None:
      self._search = SearchIndex(self)
    return self._search.search(query, k)


# -- the reward ---------------------------------------------------------------

_STOPWORDS = frozenset(
    "a an and are as at be by for from in into is it of on or the to with without "
    "pack count oz ounce ounces inch inches lb lbs set piece pieces size x".split())


def type_words(title: str) -> set:
  """The words of a title that say what the product is. WebShop takes spaCy's nouns and
  proper nouns; spaCy's English model is a hub download, so we keep the title's
  alphabetic words of 3+ letters that are not stop words (close for product titles,
  which are mostly nouns and noun modifiers)."""
  return {w for w in re.findall(r"[a-z]+", title.lower()) if len(w) > 2 and w not in _STOPWORDS}


def _fuzzy(a: str, b: str) -> bool:
  from rapidfuzz import fuzz  # a maintained C++ implementation of thefuzz's ratios
  return fuzz.token_set_ratio(a, b) > FUZZY_THRESHOLD


def reward(product: Product, goal: Goal, goal_product: Product,
           chosen_options: Mapping[str, str]) -> Tuple[float, Dict[str, float]]:
  """WebShop's purchase reward and its terms.

      r = r_type * (attributes matched + options matched + [price <= price_upper])
                 / (len(goal attributes) + len(goal options) + 1)

  r_type is 1 when the bought product is of the goal's type (same query, or two shared
  breadcrumb levels, or > 0.2 of the goal title's type words), 0.5 when only some type
  words are shared, 0.1 under 0.1 of them, 0 with none. A goal attribute matches a product
  attribute fuzzily (token-set ratio > 85) or appears in the title, features or
  description; a chosen option matches a goal option exactly for sizes, else fuzzily, or
  appears in that text. Each goal option is counted at most once (the original can count
  a chosen option the goal did not ask for, and exceed 1).
  """
  query_match = product.query == goal_product.query
  crumbs = lambda p: {c.strip() for c in p.product_category.split("›") if c.strip()}
  category_match = len(crumbs(product) & crumbs(goal_product)) >= 2
  wanted = type_words(goal_product.title)
  title_score = len(type_words(product.title) & wanted) / len(wanted) if wanted else 0.2
  r_type = 1.0
  if not (query_match or category_match or title_score > 0.2):
    r_type = 0.5
  if title_score < 0.1:
    r_type = 0.1
  if title_score == 0.0:
    r_type = 0.0

  text = " ".join([product.title, " ".join(product.features), product.description]).lower()
  attributes = sum(
      any(_fuzzy(p, g) for p in product.attributes) or g.lower() in text
      for g in goal.attributes)
  unmatched = [o.lower() for o in goal.options]
  for group, value in chosen_options.items():
    value = value.lower()
    if group.lower() in EXACT_MATCH_OPTIONS:
      hit = next((o for o in unmatched if o == value), None)
    else:
      hit = next((o for o in unmatched if _fuzzy(o, value)), None)
    if hit is None and value in text:
      hit = next((o for o in unmatched if o == value), unmatched[0] if unmatched else None)
    if hit is not None:
      unmatched.remove(hit)
  options = len(goal.options) - len(unmatched)
  price_ok = float(product.price <= goal.price_upper)
  total = (attributes + options + price_ok) / (len(goal.attributes) + len(goal.options) + 1)
  info = dict(r_type=r_type, r_attributes=attributes / max(len(goal.attributes), 1),
              r_options=options / max(len(goal.options), 1), r_price=price_ok,
              title_score=title_score, query_match=float(query_match),
              category_match=float(category_match))
  return r_type * total, info


# -- search ---------------------------------------------------------------------


def _cache_root() -> str:
  return os.environ.get("ROLLX_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "rollx"))


class SearchIndex:
  """BM25 (bm25s) over a catalog, saved under the cache keyed by the indexed text's hash,
  so each catalog is indexed once per machine."""

  def __init__(self, catalog: Catalog, cache_dir: Optional[str] = None):
    import bm25s
    self._bm25s = bm25s
    self.asins = [p.asin for p in catalog.products]
    corpus = [p.text() for p in catalog.products]
    digest = hashlib.sha1("\x00".join(self.asins + corpus).encode()).hexdigest()[:16]
    path = os.path.join(cache_dir or os.path.join(_cache_root(), "webshop_index"), digest)
    try:
      self.retriever = bm25s.BM25.load(path)
    except (OSError, ValueError, KeyError):
      self.retriever = bm25s.BM25()
      self.retriever.index(bm25s.tokenize(corpus, stopwords="en", show_progress=False),
                           show_progress=False)
      tmp = f"{path}.tmp{os.getpid()}"
      try:
        self.retriever.save(tmp)
        os.replace(tmp, path)  # atomic: concurrent env workers never read half an index
      except OSError:  # another process saved it first, or no writable cache: no matter
        shutil.rmtree(tmp, ignore_errors=True)

  def search(self, query: str, k: int) -> List[str]:
    tokens = self._bm25s.tokenize([query], stopwords="en", show_progress=False,
                                  return_ids=False)
    if not tokens or not tokens[0]:
      return []
    k = min(k, len(self.asins))
    docs, scores = self.retriever.retrieve([tokens[0]], k=k, show_progress=False,
                                           n_threads=1)
    return [self.asins[int(d)] for d, s in zip(docs[0], scores[0]) if s > 0]


# -- WebShop's file format ------------------------------------------------------


def _price(pricing, asin: str) -> Tuple[float, str]:
  """WebShop's `pricing` string ("$12.99", "$10.00$20.00") -> (price, tag); no price is
  $100, as in WebShop; a range's price is drawn once per asin (WebShop draws it
  uniformly each time the shop starts; a fixed draw keeps levels reproducible)."""
  values = [float(v) for v in re.findall(r"\d+(?:\.\d+)?", str(pricing or "").replace(",", ""))]
  if not values:
    return 100.0, "$100.0"
  if len(values) == 1:
    return values[0], f"${values[0]}"
  low, high = values[:2]
  u = (zlib.crc32(asin.encode()) % 10_000) / 10_000
  return round(low + u * (high - low), 2), f"${low} to ${high}"


def product_from_record(record: Mapping, attributes: Sequence[str]) -> Product:
  """One `items_shuffle.json` record (and its attributes from `items_ins_v2.json`)."""
  asin = str(record["asin"])
  features = record.get("small_description") or []
  if isinstance(features, str):
    features = [features]
  options = {}
  for group, values in (record.get("customization_options") or {}).items():
    if values:
      options[group.lower()] = tuple(str(v["value"]).strip().replace("/", " | ").lower()
                                     for v in values)
  price, tag = _price(record.get("pricing"), asin)
  return Product(asin=asin, title=str(record.get("name", "")),
                 category=str(record.get("category", "")),
                 query=str(record.get("query", "")).lower().strip(),
                 product_category=str(record.get("product_category", "")),
                 description=str(record.get("full_description") or ""),
                 features=tuple(str(f) for f in features), attributes=tuple(attributes),
                 options=options, price=price, price_tag=tag)


def _price_upper(price: float, key: str) -> Tuple[float, str]:
  """WebShop's goal price bound: the larger of two of the four round prices above the
  product's (drawn by `key`), or none when fewer than two exist."""
  above = [p for p in PRICE_RANGE if p > price][:4]
  if len(above) < 2:
    return 1_000_000.0, ""
  rng = np.random.default_rng(zlib.crc32(key.encode()))
  upper = float(max(rng.choice(above, 2, replace=False)))
  return upper, f", and price lower than {upper:.2f} dollars"


def _split(asin: str) -> str:
  return "validation" if zlib.crc32(asin.encode()) % 1000 < VALIDATION_SHARE * 1000 else "train"


def catalog_from_records(records: Sequence[Mapping], instructions: Mapping[str, Mapping],
                         human: Optional[Mapping[str, Sequence[Mapping]]] = None,
                         source: str = "") -> Catalog:
  """Products and goals from WebShop-format data: `records` as in items_shuffle.json,
  `instructions` as in items_ins_v2.json (asin -> attributes, instruction,
  instruction_attributes, instruction_options), `human` as in items_human_ins.json
  (asin -> [{instruction, instruction_attributes, instruction_options}]); with `human`,
  goals are the human instructions, else the synthetic ones."""
  products, seen = [], set()
  for record in records:
    asin = str(record.get("asin", ""))
    if not asin or asin == "nan" or len(asin) > 10 or asin in seen:
      continue  # WebShop skips these too
    seen.add(asin)
    products.append(product_from_record(
        record, (instructions.get(asin) or {}).get("attributes") or ()))
  goals = {"train": [], "validation": []}
  for product in products:
    if human is not None:
      specs = human.get(product.asin) or []
    else:
      spec = instructions.get(product.asin) or {}
      specs = [spec] if spec.get("instruction") else []
    for n, spec in enumerate(specs):
      attributes = tuple(spec.get("instruction_attributes") or ())
      if not attributes:
        continue  # WebShop skips goals without attributes
      options = spec.get("instruction_options") or ()
      if isinstance(options, Mapping):
        options = tuple(options.values())
      upper, price_text = _price_upper(product.price, f"{product.asin}/{n}")
      goals[_split(product.asin)].append(Goal(
          asin=product.asin, instruction=str(spec["instruction"]).strip().strip(".") + price_text,
          attributes=attributes, options=tuple(str(o).lower() for o in options),
          price_upper=upper))
  return Catalog(products, goals["train"], goals["validation"], source)


def _read_json(path: str):
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError) as e:
    raise ValueError(f"WebShop data file {path}: {e}") from None


@functools.lru_cache(maxsize=4)
def load_catalog(data_dir: str, human_goals: bool = False,
                 num_products: Optional[int] = None) -> Catalog:
  """The original WebShop files in `data_dir`: items_shuffle*.json (products),
  items_ins_v2*.json (attributes and synthetic instructions), items_human_ins*.json
  (human instructions, with `human_goals`). `num_products` keeps the first N (the files
  are shuffled), as WebShop's 1k/100k subsets do."""

  def one(pattern, what):
    found = sorted(glob.glob(os.path.join(data_dir, pattern)))
    if not found:
      raise ValueError(f"WebShop env_config.data_dir={data_dir!r} has no {pattern} ({what})")
    return found[0]

  records = _read_json(one("items_shuffle*.json", "products"))
  if num_products:
    records = records[:num_products]
  instructions = _read_json(one("items_ins_v2*.json", "attributes and instructions"))
  human = _read_json(one("items_human_ins*.json", "human instructions")) if human_goals else None
  return catalog_from_records(records, instructions, human, source=data_dir)
