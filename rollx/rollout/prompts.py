"""Env text -> token ids, turn by turn, without ever re-tokenizing model output.

A multi-turn trajectory is the concatenation of
    prompt ids (template: system + instructions + turn 1), response 1 ids (model),
    continuation ids (template: end of the assistant message, turn 2, generation
    prompt), response 2 ids (model), ...
Template pieces are encoded on their own; model responses are kept as the exact
ids the server returned (decode -> encode is not lossless, and training on ids the
model did not produce makes multi-turn RL diverge). The chat template decides how
turns are joined: `continuation` is derived from the tokenizer's own template.
Observations, instructions and system prompts are outside text: a special token they
spell is encoded as plain text (rollx/rollout/chat.py).
"""

from __future__ import annotations

import hashlib
from typing import List, Optional, Sequence

from rollx.rollout import chat

SYSTEM_PROMPT = ("You're a helpful assistant. You are a good game player. You are aiming to "
                 "get high reward in the game.")
TURN_TEMPLATE = (
    "Turn {turn_idx}:\nObservation:\n{observation}\nStrictly follow this format:\n"
    "1. output format is '<answer> [your answer] </answer>' with no extra text.\n"
    "2. You have {actions_left} actions left.\n"
    "3. Max response length: {max_response_length} words (tokens).\nDecide the next action:\n")
# The observation alone. ROLL's template above spends ~75 tokens a turn restating the
# format; a model that already answers in format (warm start, instruct model) does not
# need it, and on a small CPU budget shorter sequences mean more RL steps.
COMPACT_TURN_TEMPLATE = "{observation}"
# Short prompts for the small default model (custom_envs entry fields): a few words of
# task and the answer format instead of ROLL's paragraph, which would be most of
# every sequence's tokens on a 4x4 board.
# `system_prompt=NO_SYSTEM_PROMPT` leaves the system message (and the instructions it
# carries) out: for a model that has never read English (the default, warm started on
# env transcripts only) the words carry no information, and with history-free step-wise
# prompts they would be ~40% of every sample's tokens.
NO_SYSTEM_PROMPT = "none"
COMPACT_PROMPTS = {
    # the observation alone: 27 prompt tokens for a 4x4 grid (chat markers + 4 rows of 4
    # cells + newlines), 40 with the env's `show_neighbours` line (configs/frozenlake.py)
    "FrozenLake": dict(system_prompt=NO_SYSTEM_PROMPT, turn_template=COMPACT_TURN_TEMPLATE),
    "Sokoban": dict(system_prompt="Sokoban.", turn_template=COMPACT_TURN_TEMPLATE,
                    instructions="You are P. Push every box X onto a target O. Answer "
                                 "<answer>Up</answer>, Down, Left or Right."),
    # the env's paragraph of instructions is ~200 tokens for the default tokenizer
    "WebShop": dict(system_prompt="WebShop.", turn_template=COMPACT_TURN_TEMPLATE,
                    instructions="Buy the item of the instruction. Answer "
                                 "<answer>search[keywords]</answer> or "
                                 "<answer>click[element in brackets]</answer>."),
}
HISTORY_TEMPLATE = "Turn {turn_idx}:\nObservation:\n{observation}\nAction: {action}\nReward: {reward}\n"
_MARK_RESPONSE, _MARK_USER = "\x00RESPONSE\x00", "\x00USER\x00"


def observation_hash(observation: str) -> str:
  """GiGPO anchor-state key: identical observations share it."""
  return hashlib.sha1(observation.encode()).hexdigest()[:16]


def builder_for(entry, env, tokenizer, max_response_length: Optional[int] = None
                ) -> "PromptBuilder":
  """The PromptBuilder of a `custom_envs` entry ('' fields fall back to the defaults);
  the prompt states `max_response_length` (default: the entry's max_tokens_per_step)."""
  return PromptBuilder(tokenizer, entry.get("instructions") or env.instructions,
                       entry.get("system_prompt") or SYSTEM_PROMPT,
                       entry.get("turn_template") or TURN_TEMPLATE,
                       int(max_response_length or entry["max_tokens_per_step"]))


class PromptBuilder:

  def __init__(self, tokenizer, instructions: str, system_prompt: str = SYSTEM_PROMPT,
               turn_template: str = TURN_TEMPLATE, max_response_length: int = 64):
    self.tokenizer = tokenizer
    if system_prompt == NO_SYSTEM_PROMPT:
      self.system = None
    else:
      self.system = f"{system_prompt}\n{instructions}" if instructions else system_prompt
    self.turn_template = turn_template
    self.max_response_length = max_response_length
    self.eos_id = tokenizer.eos_token_id
    # How the chat template joins an assistant message to the next user turn.
    probe = self._render([{"role": "system", "content": "S"},
                          {"role": "user", "content": "U"},
                          {"role": "assistant", "content": _MARK_RESPONSE},
                          {"role": "user", "content": _MARK_USER}])
    after = probe[probe.index(_MARK_RESPONSE) + len(_MARK_RESPONSE):]
    self._join_before, self._join_after = after.split(_MARK_USER)
    eos_text = tokenizer.eos_token or ""
    self._join_before_no_eos = (self._join_before[len(eos_text):]
                                if eos_text and self._join_before.startswith(eos_text)
                                else self._join_before)

  def _render(self, messages) -> str:
    """The rendering of `messages`, outside strings marked (chat.encode_rendered)."""
    return self.tokenizer.apply_chat_template(chat.mark_outside_text(self.tokenizer, messages),
                                              add_generation_prompt=True, tokenize=False)

  def encode(self, text: str) -> List[int]:
    """Ids of text outside the template, special-token spellings as plain text."""
    return chat.encode_text(self.tokenizer, text)

  def turn_text(self, observation: str, turn_idx: int, actions_left: int) -> str:
    return self.turn_template.format(turn_idx=turn_idx, observation=observation,
                                     actions_left=actions_left,
                                     max_response_length=self.max_response_length)

  def first_prompt(self, observation: str, actions_left: int) -> List[int]:
    """System + instructions + turn 1, ending in the generation prompt."""
    return self.step_prompt(observation, 1, actions_left, (), 0)

  def continuation(self, observation: str, turn_idx: int, actions_left: int,
                   response_ids: Sequence[int]) -> List[int]:
    """Template ids between response `turn_idx - 1` and response `turn_idx`.

    If the response ended with EOS the template's own end-of-message marker is
    already there (generated); otherwise (cut at max tokens) it is added here.
    """
    ended = bool(response_ids) and response_ids[-1] == self.eos_id
    before = self._join_before_no_eos if ended else self._join_before
    turn = chat.mark_outside_text(self.tokenizer,
                                  self.turn_text(observation, turn_idx, actions_left))
    return chat.encode_rendered(self.tokenizer, before + turn + self._join_after)

  def step_prompt(self, observation: str, turn_idx: int, actions_left: int,
                  history: Sequence[dict], history_length: int) -> List[int]:
    """Step-wise (GiGPO) prompt: instructions, the last `history_length` steps, this turn."""
    recent = list(history)[-history_length:] if history_length > 0 else []
    text = "".join(HISTORY_TEMPLATE.format(**h) for h in recent)
    user = text + self.turn_text(observation, turn_idx, actions_left)
    system = [] if self.system is None else [{"role": "system", "content": self.system}]
    return chat.encode_rendered(self.tokenizer,
                                self._render(system + [{"role": "user", "content": user}]))
