import pytest

from envs import parsing

ACTIONS = ("Left", "Down", "Right", "Up")


@pytest.mark.parametrize("text,expected", [
    ("<answer>Right</answer>", "Right"),
    ("<ANSWER> up </Answer>", "Up"),
    ("I think <answer>left</answer> then <answer>Down</answer>", "Left"),
    ("<answer>\nDown\n</answer>", "Down"),
    ("<answer>Jump</answer>", None),
    ("<answer></answer>", None),
    ("Right", None),
    ("<answer>Right", None),
    ("", None),
])
def test_parse(text, expected):
  assert parsing.parse_action(text, ACTIONS) == expected


@pytest.mark.parametrize("garbage", [
    "", "\x00\x01\x02", "🙂🙃 <answer>🙂</answer>", "<answer>" * 5000, "x" * 10_000,
    "<answer>" + "Right" * 2000 + "</answer>", None, 12, b"<answer>Up</answer>",
    "\ud800", "<answer>Ri\u200bght</answer>",
])
def test_garbage_never_raises(garbage):
  assert parsing.parse_action(garbage, ACTIONS) is None


def test_custom_pattern_and_errors():
  assert parsing.parse_action("ACTION: up", ACTIONS, r"action:\s*(\w+)") == "Up"
  with pytest.raises(ValueError, match="capture group"):
    parsing.compile_action_pattern("<answer>.*</answer>")
  with pytest.raises(ValueError, match="not a valid regex"):
    parsing.compile_action_pattern("(")
