"""WebShop: the reward's terms by hand, the pages and actions, the original file format,
an oracle and a random policy, and fuzzed actions."""

import copy
import json
import os
import re

import gymnasium
import numpy as np
import pytest

import envs
from envs import webshop, webshop_catalog, webshop_data


def product(asin="B1", title="Acorn Gluten Free Rice Crackers", query="crackers",
            crumbs="Grocery › Snacks › Crackers", attributes=("gluten free", "non gmo"),
            options=None, price=12.0, features=("Gluten free",), description="Crunchy."):
  return webshop_data.Product(
      asin=asin, title=title, category="grocery", query=query, product_category=crumbs,
      description=description, features=tuple(features), attributes=tuple(attributes),
      options=options if options is not None else {"size": ("6 pack", "12 pack"),
                                                   "flavor": ("sea salt", "cheddar")},
      price=price, price_tag=f"${price}")


def goal(attributes=("gluten free", "non gmo"), options=("12 pack", "cheddar"), upper=20.0):
  return webshop_data.Goal(asin="B1", instruction="i need crackers", attributes=attributes,
                           options=options, price_upper=upper)


def test_the_reward_of_a_perfect_purchase_is_one_and_each_term_counts():
  target = product()
  full, info = webshop_data.reward(target, goal(), target, {"size": "12 pack", "flavor": "cheddar"})
  assert full == 1.0 and info["r_type"] == 1.0
  # 2 attributes + 2 options + price = 5 terms; each miss costs 1/5
  wrong_size, _ = webshop_data.reward(target, goal(), target, {"size": "6 pack", "flavor": "cheddar"})
  assert wrong_size == pytest.approx(4 / 5)
  no_options, _ = webshop_data.reward(target, goal(), target, {})
  assert no_options == pytest.approx(3 / 5)
  too_dear, _ = webshop_data.reward(target, goal(upper=10.0), target,
                                    {"size": "12 pack", "flavor": "cheddar"})
  assert too_dear == pytest.approx(4 / 5)
  # an attribute the product lacks (neither in its list nor its text)
  vegan, _ = webshop_data.reward(target, goal(attributes=("gluten free", "vegan")), target,
                                 {"size": "12 pack", "flavor": "cheddar"})
  assert vegan == pytest.approx(4 / 5)


def test_attribute_and_option_matching_rules():
  target = product()
  # fuzzy attribute match (token-set ratio > 85): word order does not matter
  fuzzy = product(attributes=("free gluten", "non gmo"))
  assert webshop_data.reward(fuzzy, goal(), target, {"size": "12 pack", "flavor": "cheddar"})[0] == 1.0
  # an attribute named only in the description still matches
  in_text = product(attributes=(), features=(), description="Non gmo and gluten free.")
  assert webshop_data.reward(in_text, goal(), target, {"size": "12 pack", "flavor": "cheddar"})[0] == 1.0
  # size matches exactly only: "12 packs" is not "12 pack"; flavour fuzzily
  r, info = webshop_data.reward(target, goal(options=("12 pack", "cheddar cheese")), target,
                                {"size": "12 packs", "flavor": "cheddar"})
  assert info["r_options"] == 0.5 and r == pytest.approx(4 / 5)
  # a goal option counts once however many chosen options could claim it
  r, info = webshop_data.reward(target, goal(options=("cheddar",)), target,
                                {"size": "cheddar", "flavor": "cheddar"})
  assert info["r_options"] == 1.0 and r == 1.0
  # an option value the product's title names counts (WebShop's rule)
  titled = product(title="Acorn Gluten Free Rice Crackers Sea Salt")
  r, _ = webshop_data.reward(titled, goal(options=("cheddar",)), titled, {"flavor": "sea salt"})
  assert r == 1.0


@pytest.mark.parametrize("title, query, crumbs, r_type", [
    ("Acorn Gluten Free Rice Crackers", "crackers", "Grocery › Snacks › Crackers", 1.0),
    # same type words, other query and category: title score 1 > 0.2
    ("Rice Crackers Acorn", "chips", "Home › Kitchen", 1.0),
    # 1 of 5 type words (0.2, not > 0.2), no query or category match
    ("Crackers Tin", "tins", "Home › Kitchen", 0.5),
    # same query, 1 of 5 words: query match keeps 1
    ("Crackers Tin", "crackers", "Home › Kitchen", 1.0),
    # no shared type word at all
    ("Bluebell Office Chair", "crackers", "Grocery › Snacks › Crackers", 0.0),
])
def test_the_product_type_factor(title, query, crumbs, r_type):
  target = product()
  bought = product(asin="B2", title=title, query=query, crumbs=crumbs)
  _, info = webshop_data.reward(bought, goal(), target, {})
  assert info["r_type"] == r_type


def test_type_factor_below_a_tenth():
  target = product(title="Acorn Gluten Free Rice Crackers Snack Mix Bag Party Size Box Tin Jar")
  bought = product(asin="B2", title="Jar Lid", query="lids", crumbs="Home › Kitchen")
  _, info = webshop_data.reward(bought, goal(), target, {})
  assert info["title_score"] < 0.1 and info["r_type"] == 0.1


def play(env, policy, seed, rng):
  env.reset(seed=seed)
  while True:
    response = webshop.oracle_response(env) if policy == "oracle" else env.sample_valid_response(rng)
    _, r, terminated, truncated, info = env.step(response)
    if terminated or truncated:
      return (r if terminated else 0.0), info["success"], env.num_steps


def test_an_oracle_buys_the_goal_on_validation_and_a_random_policy_rarely_does():
  env = envs.make_env("WebShop", {"split": "validation"})
  goals = env.catalog.validation_goals
  assert len(goals) >= 250
  oracle = [play(env, "oracle", seed, None) for seed in range(len(goals))]
  assert np.mean([s for _, s, _ in oracle]) >= 0.95
  rng = np.random.default_rng(0)
  random = [play(env, "random", seed, rng) for seed in range(300)]
  assert np.mean([s for _, s, _ in random]) < 0.1 and 0 < np.mean([r for r, _, _ in random]) < 0.5


def test_a_success_bonus_adds_to_a_full_match_alone():
  """`success_bonus` raises a success's reward by itself and leaves a partial purchase, the
  success flag and the reward's terms as WebShop scores them."""
  plain = envs.make_env("WebShop", {"split": "validation", "num_products": 300})
  shaped = envs.make_env("WebShop", {"split": "validation", "num_products": 300,
                                     "success_bonus": 1.5})
  rng_a, rng_b = np.random.default_rng(0), np.random.default_rng(0)
  for seed in range(3):
    assert play(shaped, "oracle", seed, None)[:2] == (2.5, True)
    r, ok, _ = play(plain, "oracle", seed, None)
    assert (r, ok) == (1.0, True)
  partial = 0
  for seed in range(40):  # the same random episodes with and without the bonus
    (r0, ok0, _), (r1, ok1, _) = play(plain, "random", seed, rng_a), play(shaped, "random", seed, rng_b)
    assert ok0 == ok1 and plain.last_reward_info == shaped.last_reward_info
    assert r1 == pytest.approx(r0 + (1.5 if ok0 else 0.0))
    partial += 0 < r0 < 1
  assert partial >= 5
  with pytest.raises(ValueError, match="success_bonus"):
    envs.make_env("WebShop", {"success_bonus": -1.0})


def test_an_option_bonus_pays_the_goal_options_chosen_right_and_nothing_else():
  """`option_bonus` adds bonus x r_type x (goal options chosen right) / (goal options) to a
  purchase: the oracle's full choice earns all of it, buying without a click none of it,
  and WebShop's own reward and terms stay as they were."""
  plain = envs.make_env("WebShop", {"split": "validation", "num_products": 300})
  shaped = envs.make_env("WebShop", {"split": "validation", "num_products": 300,
                                     "option_bonus": 0.5})
  with_options = []  # seeds whose goal names options
  for seed in range(60):
    shaped.reset(seed=seed)
    if shaped.goal.options and len(with_options) < 3:
      with_options.append(seed)
  assert len(with_options) == 3
  for seed in with_options:
    assert play(shaped, "oracle", seed, None)[:2] == (1.5, True)
    # the oracle's path up to the item page, then Buy Now with no option chosen
    shaped.reset(seed=seed)
    while shaped.page != "item":
      shaped.step(webshop.oracle_response(shaped))
    _, r, terminated, _, info = shaped.step("<answer>click[Buy Now]</answer>")
    assert terminated and info["reward_terms"]["r_options"] == 0.0
    assert r == pytest.approx(webshop_data.reward(
        shaped.product, shaped.goal, shaped.catalog.by_asin[shaped.goal.asin], {})[0])
  rng_a, rng_b = np.random.default_rng(1), np.random.default_rng(1)
  paid = 0
  for seed in range(40):  # the same random episodes with and without the bonus
    (r0, ok0, _), (r1, ok1, _) = play(plain, "random", seed, rng_a), play(shaped, "random", seed, rng_b)
    assert ok0 == ok1 and plain.last_reward_info == shaped.last_reward_info
    terms = plain.last_reward_info
    bonus = 0.5 * terms["r_type"] * terms["r_options"] if terms else 0.0
    assert r1 == pytest.approx(r0 + bonus)
    paid += bonus > 0
  assert paid >= 2
  with pytest.raises(ValueError, match="option_bonus"):
    envs.make_env("WebShop", {"option_bonus": -1.0})


def test_an_option_click_bonus_pays_each_goal_option_once_at_the_click_that_sets_it():
  """`option_click_bonus` pays bonus x r_type / (goal options) on the click that first
  chooses a goal option right: a re-click, a wrong value, or the same choice again on a
  re-opened product pays nothing, an episode earns at most the bonus, and the purchase
  keeps WebShop's reward."""
  bonus = 0.5
  plain = envs.make_env("WebShop", {"split": "validation", "num_products": 300})
  shaped = envs.make_env("WebShop", {"split": "validation", "num_products": 300,
                                     "option_click_bonus": bonus})
  two_options = []  # seeds whose goal names two options
  for seed in range(100):
    shaped.reset(seed=seed)
    if len(shaped.goal.options) == 2 and len(two_options) < 3:
      two_options.append(seed)
  assert len(two_options) == 3
  for seed in two_options:
    shaped.reset(seed=seed)
    while shaped.page != "item":
      shaped.step(webshop.oracle_response(shaped))
    asin = shaped.asin
    wanted = webshop._options_for(shaped.product, shaped.goal)
    group, value = next(iter(wanted.items()))
    target = shaped.catalog.by_asin[shaped.goal.asin]
    wrong = next(v for v in shaped.product.options[group] if webshop_data.reward(
        shaped.product, shaped.goal, target, {group: v})[1]["r_options"] == 0)
    assert shaped.step(f"<answer>click[{wrong}]</answer>")[1] == 0.0
    assert shaped.step(f"<answer>click[{value}]</answer>")[1] == pytest.approx(bonus / 2)
    assert shaped.step(f"<answer>click[{value}]</answer>")[1] == 0.0  # a re-click
    shaped.step("<answer>click[< Prev]</answer>")
    shaped.step(f"<answer>click[{asin}]</answer>")  # the same product, its choice reset
    assert shaped.page == "item" and not shaped.chosen
    assert shaped.step(f"<answer>click[{value}]</answer>")[1] == 0.0
    clicks = []
    while True:
      _, r, terminated, _, info = shaped.step(webshop.oracle_response(shaped))
      if terminated:
        break
      clicks.append(r)
    assert clicks == [pytest.approx(bonus / 2)] and (r, info["success"]) == (1.0, True)
    assert info["action_kind"] == "buy"
  rng_a, rng_b = np.random.default_rng(2), np.random.default_rng(2)
  paid = 0
  for seed in range(40):  # the same random episodes with and without the bonus
    plain.reset(seed=seed)
    shaped.reset(seed=seed)
    earned = 0.0
    while True:
      _, r0, t0, u0, _ = plain.step(plain.sample_valid_response(rng_a))
      _, r1, t1, u1, _ = shaped.step(shaped.sample_valid_response(rng_b))
      assert (t0, u0) == (t1, u1)
      if t1:
        assert r1 == r0 and plain.last_reward_info == shaped.last_reward_info
        break
      assert r0 == 0.0 and r1 >= 0.0
      earned += r1
      if u1:
        break
    assert earned <= bonus + 1e-9
    paid += earned > 0
  assert paid >= 2
  with pytest.raises(ValueError, match="option_click_bonus"):
    envs.make_env("WebShop", {"option_click_bonus": -1.0})


def test_a_random_search_is_a_span_of_the_instruction_of_any_length():
  # the warm start copies these searches: spans up to the whole instruction leave a
  # policy room to learn which words to search (a 1-3 word span caps success near 2%)
  env = envs.make_env("WebShop", {"split": "train"})
  env.reset(seed=5)
  words = env.goal.instruction.split()
  rng = np.random.default_rng(0)
  lengths = set()
  for _ in range(2000):
    answer = env.sample_valid_response(rng)
    query = re.fullmatch(r"<answer>search\[(.*)\]</answer>", answer).group(1).split()
    assert any(words[i:i + len(query)] == query for i in range(len(words))), answer
    lengths.add(len(query))
  assert lengths == set(range(1, len(words) + 1))


def test_the_random_shopper_follows_the_shop_and_never_reads_the_goal():
  """envs.webshop.shopper_response (the WebShop start recipe's optional third stage): a
  random span searched, a listed product opened, each option group chosen once in the
  page's order, then Buy Now; every action valid. Its clicks are the same whatever the
  goal (each goal is tried on the same page with the same random state), and its option
  values are right no more often than chance."""
  env = envs.make_env("WebShop", {"split": "train", "max_steps": 15})
  others = env.catalog.train_goals[:20]
  rng = np.random.default_rng(0)
  purchases = right = chances = 0.0
  for seed in range(200):
    env.reset(seed=seed)
    kinds = []
    while True:
      if env.page != "search":  # the same click, whoever's goal the page is shown for
        real = env.goal
        clicks = set()
        for goal in (real, *others):
          env.goal = goal
          clicks.add(webshop.shopper_response(env, copy.deepcopy(rng)))
        env.goal = real
        assert len(clicks) == 1, clicks
      if env.page == "item" and len(env.chosen) < len(env.product.options):
        group = next(g for g in env.product.options if g not in env.chosen)
        chances += 1 / len(env.product.options[group])
      answer = webshop.shopper_response(env, rng)
      _, _, terminated, truncated, info = env.step(answer)
      assert info["action_is_valid"], answer
      kinds.append(info["action_kind"])
      if kinds[-1] == "option":
        right += env.chosen[group] in {o.lower() for o in env.goal.options}
      if terminated or truncated:
        break
    if kinds[-1] == "buy":
      purchases += 1
      # (a search that lists nothing goes back to search again)
      tail = ["search", "product"] + ["option"] * len(env.product.options) + ["buy"]
      assert kinds[-len(tail):] == tail, kinds
      assert set(kinds[:-len(tail)]) <= {"search", "navigate"}, kinds
  assert purchases >= 190
  # no better than chance (a value the goal names may be missing from another product)
  assert 0 < right < 1.2 * chances, (right, chances)


def test_training_and_validation_goals_come_from_disjoint_products():
  catalog = webshop_catalog.synthetic_catalog(3000, 0)
  train = {g.asin for g in catalog.train_goals}
  validation = {g.asin for g in catalog.validation_goals}
  assert train and validation and not train & validation
  assert len(catalog.products) == 3000 and len({p.category for p in catalog.products}) == 10
  again = webshop_catalog.synthetic_records(50, 0)
  assert again == webshop_catalog.synthetic_records(50, 0)  # deterministic
  assert again != webshop_catalog.synthetic_records(50, 1)


def test_pages_and_actions():
  env = gymnasium.make("rollx/WebShop-v0", split="validation").unwrapped
  obs, _ = env.reset(seed=3)
  assert obs.startswith("Instruction: ") and "[Search]" in obs
  _, r, _, _, info = env.step("<answer>click[Next >]</answer>")  # no such element here
  assert not info["action_is_valid"] and r == env.config.format_penalty
  obs, _, _, _, info = env.step(f"<answer>search[{env.goal.instruction}]</answer>")
  assert info["action_is_valid"] and env.page == "results" and info["action_kind"] == "search"
  asins = env._page_asins()
  assert len(asins) == 10 and all(f"[{a}]" in obs for a in asins) and "[Next >]" in obs
  assert env.available_actions() == {"has_search_bar": False, "clickables": env.clickables()}
  info = env.step("<answer>search[more]</answer>")[4]  # no search bar
  assert not info["action_is_valid"] and info["action_kind"] is None
  assert env.step("<answer>CLICK[next >]</answer>")[4]["action_kind"] == "navigate"  # any case
  assert env.result_page == 2 and "[< Prev]" in env.render_text()
  env.step("<answer>click[< prev]</answer>")
  assert env.result_page == 1
  obs, _, _, _, info = env.step(f"<answer>click[{asins[0].lower()}]</answer>")
  assert env.page == "item" and env.catalog.by_asin[asins[0]].title in obs
  assert info["action_kind"] == "product"
  values = next(iter(env.product.options.values()))
  assert env.step(f"<answer>click[{values[0]}]</answer>")[4]["action_kind"] == "option"
  obs, *_ = env.step("<answer>click[Features]</answer>")
  assert env.page == "Features" and env.product.features[0] in obs
  env.step("<answer>click[< Prev]</answer>")
  assert env.page == "item"
  env.step("<answer>click[< Prev]</answer>")
  assert env.page == "results"
  env.step("<answer>click[Back to Search]</answer>")
  assert env.page == "search"
  frame = env.render("rgb_array")
  assert frame.shape == (480, 640, 3) and frame.min() < 255


def test_fuzzed_actions_never_raise_and_random_episodes_stay_within_max_steps():
  env = envs.make_env("WebShop", {"max_steps": 15})
  rng = np.random.default_rng(7)
  env.reset(seed=0)
  env.step(f"<answer>search[{env.goal.instruction}]</answer>")
  fuzz = ["", "<answer></answer>", "<answer>click[</answer>", "<answer>click[]</answer>",
          "<answer>search[]</answer>", "<answer>click[B99999]</answer>", "click[buy now]",
          "<answer>clíck[ünïcødé ✓]</answer>", "<answer>click[" + "x" * 10_000 + "]</answer>",
          "<answer>search[" + "y" * 10_000 + "]</answer>", None, 42, "<answer>click[[x]]</answer>",
          "<answer>buy[now]</answer>"]
  for text in fuzz:
    if env.done:
      env.reset(seed=1)
    _, _, _, _, info = env.step(text)
    assert not info["action_is_valid"], text
  for episode in range(1000):
    env.reset(seed=episode)
    done = False
    while not done:
      if rng.random() < 0.2:
        response = "<answer>click[" + "".join(rng.choice(list("ab[]< >")) for _ in range(5)) + "]"
      else:
        response = env.sample_valid_response(rng)
      _, _, terminated, truncated, _ = env.step(response)
      done = terminated or truncated
    assert env.num_steps <= 15


def test_the_loader_reads_webshops_original_file_format(tmp_path):
  records = [
      {"asin": "B000TEST01", "name": "Pine Soy Candle", "category": "home",
       "query": "Candles ", "product_category": "Home › Decor › Candles",
       "full_description": "A pine scented candle.", "small_description": "Burns 40 hours",
       "pricing": "$10.00$20.00", "images": ["x.jpg"],
       "customization_options": {"Size": [{"value": "8 oz/Large", "image": None}]}},
      {"asin": "nan", "name": "skipped", "pricing": "", "customization_options": None},
      {"asin": "B000TEST02", "name": "Cedar Candle", "category": "home", "query": "candles",
       "product_category": "Home › Decor", "full_description": "", "small_description": [],
       "pricing": "", "images": [""], "customization_options": None},
  ]
  instructions = {
      "B000TEST01": {"attributes": ["soy wax", "long lasting"],
                     "instruction": "i want a long lasting soy wax candle.",
                     "instruction_attributes": ["soy wax"],
                     "instruction_options": {"size": "8 oz | large"}},
      "B000TEST02": {"attributes": ["cedar"], "instruction": "a cedar candle",
                     "instruction_attributes": []},  # no attributes: skipped, as in WebShop
  }
  human = {"B000TEST01": [{"instruction": "pine candle please", "instruction_attributes": ["soy wax"],
                           "instruction_options": ["8 oz | large"]}]}
  for name, data in (("items_shuffle_1k.json", records), ("items_ins_v2_1k.json", instructions),
                     ("items_human_ins.json", human)):
    (tmp_path / name).write_text(json.dumps(data))
  catalog = webshop_data.load_catalog(str(tmp_path))
  assert [p.asin for p in catalog.products] == ["B000TEST01", "B000TEST02"]
  candle = catalog.by_asin["B000TEST01"]
  assert candle.options == {"size": ("8 oz | large",)} and candle.query == "candles"
  assert candle.price_tag == "$10.0 to $20.0" and 10.0 <= candle.price <= 20.0
  assert candle.features == ("Burns 40 hours",) and candle.attributes == ("soy wax", "long lasting")
  assert catalog.by_asin["B000TEST02"].price == 100.0  # no price: $100, as in WebShop
  goals = catalog.train_goals + catalog.validation_goals
  assert len(goals) == 1 and goals[0].instruction.startswith("i want a long lasting soy wax candle")
  # the larger of two of the four round prices above the product's
  above = [p for p in webshop_data.PRICE_RANGE if p > candle.price][:4]
  assert goals[0].price_upper in above[1:]
  assert goals[0].instruction.endswith(f", and price lower than {goals[0].price_upper:.2f} dollars")
  humans = webshop_data.load_catalog(str(tmp_path), human_goals=True)
  hgoals = humans.train_goals + humans.validation_goals
  assert [g.options for g in hgoals] == [("8 oz | large",)]
  # the env plays on it: buy the candle with its option
  env = envs.make_env("WebShop", {"data_dir": str(tmp_path), "split": "all"})
  env.reset(seed=0)
  while not env.done:
    _, r, *_ = env.step(webshop.oracle_response(env))
  assert r == 1.0
  with pytest.raises(ValueError, match="missing' has no items_shuffle"):
    webshop_data.load_catalog(str(tmp_path / "missing"))
  (tmp_path / "items_human_ins.json").unlink()
  with pytest.raises(ValueError, match="no items_human_ins"):
    webshop_data.load_catalog(str(tmp_path), human_goals=True, num_products=1)


def test_bad_config_names_the_key():
  with pytest.raises(ValueError, match="split"):
    envs.make_env("WebShop", {"split": "test"})
  with pytest.raises(ValueError, match="human_goals"):
    envs.make_env("WebShop", {"human_goals": True})
  with pytest.raises(ValueError, match="data_dir"):
    envs.make_env("WebShop", {"data_dir": "/nonexistent/webshop"})


def test_the_search_index_is_cached_on_disk(tmp_path, monkeypatch):
  monkeypatch.setenv("ROLLX_CACHE", str(tmp_path))
  catalog = webshop_catalog.synthetic_catalog(200, 5)
  first = webshop_data.SearchIndex(catalog).search("gluten free crackers", 50)
  saved = os.listdir(tmp_path / "webshop_index")
  assert len(saved) == 1
  again = webshop_data.SearchIndex(catalog).search("gluten free crackers", 50)
  assert first == again and len(first) > 0
  assert all("crackers" in catalog.by_asin[a].text().lower() for a in first[:3])


def test_a_person_shops_with_rollx_play():
  import subprocess
  import sys
  from tests.conftest import ROOT
  env = envs.make_env("WebShop", {"split": "train", "max_steps": 10, "results_per_page": 5,
                                  "num_products": 3000})
  env.reset(seed=0)
  kind = env.catalog.by_asin[env.goal.asin].query
  env.step(f"<answer>search[{kind}]</answer>")
  first = env._page_asins()[0]
  answers = (f"<answer>search[{kind}]</answer>\nclick[nothing]\n<answer>click[{first}]</answer>\n"
             "<answer>click[Buy Now]</answer>\n")
  result = subprocess.run(
      [sys.executable, "-m", "rollx.play", "--config=configs/webshop.py", "--env=WebShop",
       "--policy=human", "--config.output_dir=/nonexistent"], input=answers, cwd=ROOT,
      capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  out = result.stdout
  # +0.00: the config's format penalty
  assert f"[action] search[{kind}]" in out and "[action] INVALID   [reward] +0.00" in out
  assert f"[action] click[{first}]" in out and "[action] click[Buy Now]" in out
  assert "4 turns, 1 invalid" in out and "ended: terminated" in out


def _assert_extends_the_tool_model(model_dir, trained):
  """`model_dir` is the tool model with the shop's words added to its tokenizer (every
  tool token keeps its id; a shop word is one token) and its embeddings grown for them;
  `trained`: its weights moved on from the tool model's, else equal up to the new rows."""
  import json
  from safetensors.numpy import load_file
  from rollx import models
  from rollx.models import hf
  for name in ("tokenizer_config.json", "chat_template.jinja"):
    with open(os.path.join(model_dir, name)) as a, \
         open(os.path.join(models.DEFAULT_TOOLS_MODEL_DIR, name)) as b:
      assert a.read() == b.read(), name
  with open(os.path.join(model_dir, "config.json")) as a, \
       open(os.path.join(models.DEFAULT_TOOLS_MODEL_DIR, "config.json")) as b:
    shop_cfg, tools_cfg = json.load(a), json.load(b)
  assert shop_cfg["vocab_size"] > tools_cfg["vocab_size"]
  assert dict(shop_cfg, vocab_size=0) == dict(tools_cfg, vocab_size=0)
  shop_tok, tools_tok = hf.load_tokenizer(model_dir), hf.load_tokenizer(models.DEFAULT_TOOLS_MODEL_DIR)
  shop_vocab = shop_tok.get_vocab()
  assert all(shop_vocab[t] == i for t, i in tools_tok.get_vocab().items())
  for word in ("search", "gluten", " gluten", " crackers", " looking", " dollars"):
    assert len(shop_tok.encode(word, add_special_tokens=False)) == 1, word
  shop = load_file(os.path.join(model_dir, "model.safetensors"))
  tools = load_file(os.path.join(models.DEFAULT_TOOLS_MODEL_DIR, "model.safetensors"))
  assert shop.keys() == tools.keys()
  embed, n = "model.embed_tokens.weight", len(tools_tok)
  same = [np.array_equal(shop[k], tools[k]) for k in shop if k != embed]
  same.append(np.array_equal(shop[embed][:n], tools[embed][:n]))
  assert not all(same) if trained else all(same)


def test_the_webshop_config_starts_from_the_shipped_webshop_model():
  """configs/webshop.py starts RL from rollx/models/default_webshop: the tool model, its
  tokenizer extended with the shop's words, its weights warm started."""
  from rollx import checks, config as config_lib, models
  from tests.conftest import ROOT
  config = checks.validate(config_lib.load_file(os.path.join(ROOT, "configs", "webshop.py")))
  assert config.pretrain == models.DEFAULT_WEBSHOP_MODEL_DIR and config.warm_start_steps == 0
  _assert_extends_the_tool_model(models.DEFAULT_WEBSHOP_MODEL_DIR, trained=True)


def test_the_webshop_start_recipe_trains_the_tool_model_on_answers_alone(tmp_path, monkeypatch):
  """`python -m rollx.recipes.webshop_start`'s settings reach the warm start: the tool
  model with the shop's words in its vocabulary, the config's WebShop pages cut
  step-wise, the loss on the answers alone (`warm_start_responses_only`); the training
  itself is stubbed here (the slow test below rebuilds the shipped model). With
  `shopper_steps` (0 by default: not in the shipped start), a third stage on
  random-shopper transcripts of the same pages, in the same directory."""
  import inspect
  from rollx import models
  from rollx.models import hf
  from rollx.recipes import warm_start, webshop_start
  calls = []

  def fake_warm_start(model_dir, steps, **kwargs):
    calls.append(dict(kwargs, steps=steps, model_dir=model_dir))
    _assert_extends_the_tool_model(model_dir, trained=False)
    calls[-1]["search_ids"] = hf.load_tokenizer(model_dir).encode("search[",
                                                                   add_special_tokens=False)
  monkeypatch.setattr(warm_start, "warm_start", fake_warm_start)
  assert inspect.signature(webshop_start.build).parameters["shopper_steps"].default == 0
  monkeypatch.setattr(webshop_start, "SHOPPER_EPISODES", 40)
  out = webshop_start.build(str(tmp_path / "shop"), steps=2, shopper_steps=3)
  random_play, shopper = calls
  assert random_play["steps"] == 2 and shopper["steps"] == 3
  assert shopper["model_dir"] == out
  for seen in calls:
    assert "WebShop" in seen["responses_only"]
    episodes = seen["episodes"]
    assert episodes and {t.ticket.tag for t in episodes} == {"WebShop"}
    assert all(len(t.samples) == len(t.transcript) for t in episodes)  # one sample a page
    # the episodes are tokenized with the extended tokenizer
    answers = [t.samples[0].input_ids for t in episodes]
    assert any(seen["search_ids"][0] in ids for ids in answers)
  # the shopper's episodes: every action valid, most end in a purchase
  assert len(shopper["episodes"]) == 40
  bought = 0
  for t in shopper["episodes"]:
    actions = [s["action"] for s in t.transcript]
    assert all(s["valid"] for s in t.transcript) and actions[0].startswith("search["), actions
    bought += actions[-1] == "click[Buy Now]"
  assert bought >= 36
  assert sorted(os.listdir(out)) == sorted(os.listdir(models.DEFAULT_TOOLS_MODEL_DIR))


@pytest.mark.slow  # ~31-75 min on 2 cores
def test_the_shipped_webshop_start_is_its_recipe(tmp_path):
  """`python -m rollx.recipes.webshop_start` rebuilds rollx/models/default_webshop bit for
  bit (on the kind of CPU that built it: another one's float rounding may differ).

  Run as its command runs, in a process of its own, without the tests' XLA_FLAGS
  (tests/conftest.py): 8 devices change how XLA splits a matmul across threads, hence the
  float rounding (a 20-step build with and without the flag differs by ~2e-4)."""
  import pathlib
  import subprocess
  import sys
  from safetensors.numpy import load_file
  from rollx import models
  from tests.conftest import ROOT, TEST_XLA_FLAGS
  env = dict(os.environ, XLA_FLAGS=" ".join(
      f for f in os.environ.get("XLA_FLAGS", "").split() if f not in TEST_XLA_FLAGS))
  out = tmp_path / "shop"
  subprocess.run([sys.executable, "-m", "rollx.recipes.webshop_start", f"--out_dir={out}"],
                 cwd=ROOT, env=env, check=True)
  rebuilt = load_file(str(out / "model.safetensors"))
  shipped = load_file(os.path.join(models.DEFAULT_WEBSHOP_MODEL_DIR, "model.safetensors"))
  assert rebuilt.keys() == shipped.keys()
  for k in shipped:
    np.testing.assert_array_equal(rebuilt[k], shipped[k], err_msg=k)
  for name in ("tokenizer.json", "config.json"):
    assert (out / name).read_bytes() == \
        pathlib.Path(models.DEFAULT_WEBSHOP_MODEL_DIR, name).read_bytes(), name
