"""Builds the built-in default model directory `rollx/models/default/` (run once, shipped).

    python -m rollx.recipes.make_default        # ~12 min on 2 CPU cores
    python -m rollx.recipes.make_default --nosokoban_neighbours --out_dir=DIR  # the earlier recipe

1. A byte-level BPE tokenizer (the `tokenizers` library) trained on text the envs
   and prompt templates produce: system prompt, game instructions, rendered
   observations, the turn template, answers. Byte-level means any text encodes
   (no unknown token); words merge, grid symbols never do (one token per cell),
   and the answer tags are single tokens (`<answer>Right</answer>` is three tokens).
2. A small Qwen2-architecture policy (~0.7M params, tied embeddings), initialised
   from a fixed seed, then warm started on random-play transcripts
   (`rollx.recipes.warm_start`: next-token prediction on observations and random
   valid answers, no reward, no task signal), saved as an ordinary HF directory, so
   `pretrain` unset and `pretrain=/path/to/Qwen2.5-0.5B-Instruct` take the same
   code path.

The tokenizer and config are byte-for-byte reproducible; the weights are
reproducible up to XLA's floating-point reduction order on the host that runs it.
"""

from __future__ import annotations


import jax
import numpy as np

from rollx.models import DEFAULT_MODEL_DIR
VOCAB_SIZE = 1024
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# The answer tags are single (non-special) tokens: a well-formed action is then
# three tokens, `<answer>` `Right` `</answer>`, which a tiny model learns quickly.
ANSWER_TOKENS = ["<answer>", "</answer>"]
THINK_TOKENS = ["<think>", "</think>"]  # only in a `think` build (see `build`)
# One character that is neither whitespace nor a lowercase letter, and not the
# capital that starts a word.
# Small enough that RL on 2 CPU cores runs a step in seconds; deep enough to read a
# grid and find the newest observation in a multi-turn context.
HIDDEN, LAYERS, HEADS = 128, 3, 4
# RoPE base 100, not Qwen2's 10000: prompts here are ~30-400 tokens and the skill RL
# lacked is a lookup at exact small offsets (the grid cells next to P, +-1 and +-5
# tokens away). With base 10000 most of the 16 rotation frequencies turn by well under
# a radian across a whole board, so few dims tell offset 4 from 5; with base 100 they
# spread over the board's scale. Measured with a supervised probe (shortest-path
# labels, same labels and seed, 2026-11-24): trap accuracy 0.83 vs 0.70
# and greedy validation 0.87 vs 0.81 after 65k labels, 0.69 vs 0.47 after 8k.
ROPE_THETA = 100.0
WARM_START_STEPS = 500  # random-play transcript pretraining (rollx.recipes.warm_start)
GRID_SYMBOL = r"[^\sa-z](?![a-z])"
# ChatML, as Qwen2.5 writes it: with `tools`, the system message lists them (one JSON
# function signature per line in <tools>) and says how to call one; a `tool` message is
# a <tool_response> block inside a user turn (consecutive ones share the turn); an
# assistant message's `tool_calls` (OpenAI's form) render as <tool_call> blocks after its
# text. Without tools it renders exactly as before, so the shipped prompts did not change.
CHAT_TEMPLATE = (
    "{%- if tools %}{{ '<|im_start|>system\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{ messages[0]['content'] + '\n\n' }}{%- endif %}"
    "{{ '# Tools\n<tools>' }}{%- for tool in tools %}{{ '\n' }}{{ tool | tojson }}{%- endfor %}"
    "{{ '\n</tools>\nCall a tool with <tool_call>\n{\"name\": <name>, \"arguments\": "
    "<arguments>}\n</tool_call><|im_end|>\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if tools and loop.first and message['role'] == 'system' %}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}"
    "{{ '<|im_start|>user' }}{%- endif %}"
    "{{ '\n<tool_response>\n' + message['content'] + '\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}"
    "{{ '<|im_end|>\n' }}{%- endif %}"
    "{%- elif message['role'] == 'assistant' and message['tool_calls'] is defined "
    "and message['tool_calls'] %}"
    "{{ '<|im_start|>assistant\n' + (message['content'] or '') }}"
    "{%- for call in message['tool_calls'] %}"
    "{%- set f = call['function'] if call['function'] is defined else call %}"
    "{%- if message['content'] or not loop.first %}{{ '\n' }}{%- endif %}"
    "{{ '<tool_call>\n{\"name\": \"' + f['name'] + '\", \"arguments\": ' }}"
    "{{ f['arguments'] | tojson }}{{ '}\n</tool_call>' }}"
    "{%- endfor %}{{ '<|im_end|>\n' }}"
    "{%- else %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{%- endif %}")


def corpus():
  """Text of the kind the default model sees: env prompts, observations, answers."""
  import envs
  from envs import sokoban
  from rollx.rollout.prompts import SYSTEM_PROMPT, TURN_TEMPLATE
  rng = np.random.default_rng(0)
  specs = [("FrozenLake", {}), ("FrozenLake", {"is_slippery": True}),
           ("FrozenLake", {"size": 6}), ("FrozenLake", {"show_neighbours": True})]
  specs += [("Sokoban", v) for v in sokoban.VARIANTS.values()]
  for env_type, env_config in specs:
    env = envs.make_env(env_type, env_config)
    for seed in range(40):
      obs, _ = env.reset(seed=seed)
      yield SYSTEM_PROMPT + "\n" + env.instructions
      for turn in range(1, 4):
        yield TURN_TEMPLATE.format(turn_idx=turn, observation=obs,
                                   actions_left=env.actions_left, max_response_length=8)
        answer = env.sample_valid_response(rng)
        yield answer
        obs, _, terminated, truncated, _ = env.step(answer)
        if terminated or truncated:
          break
  for action in ("Left", "Down", "Right", "Up"):
    for form in ("<answer>{}</answer>", "<answer> {} </answer>", "{}"):
      yield form.format(action) * 3
  # The chat roles and the compact prompts are in every sample: whole-word tokens.
  from rollx.rollout.prompts import COMPACT_PROMPTS, NO_SYSTEM_PROMPT
  for _ in range(20):
    for role in ("system", "user", "assistant"):
      yield f"<|im_start|>{role}\n"
    for prompt in (COMPACT_PROMPTS[k] for k in ("FrozenLake", "Sokoban")):  # the grid games'
      if prompt["system_prompt"] != NO_SYSTEM_PROMPT:
        yield prompt["system_prompt"] + "\n" + prompt.get("instructions", "")


def build_tokenizer(think: bool = False):
  import tokenizers
  from tokenizers import decoders, models, pre_tokenizers, trainers
  import transformers
  tok = tokenizers.Tokenizer(models.BPE())
  # Every symbol that is not part of a lowercase word is its own pre-token: a grid
  # row "_OP_" is then four tokens, one per cell, the same token for the same tile
  # wherever it stands (BPE would merge "OP" or "#__" and hide the board's geometry
  # from a small model). Words ("Right", "Push") and numbers stay cheap.
  tok.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.Split(tokenizers.Regex(GRID_SYMBOL), behavior="isolated"),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIAL_TOKENS,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                show_progress=False)
  tok.train_from_iterator(list(corpus()), trainer)
  tok.add_tokens([tokenizers.AddedToken(t, normalized=False, special=False)
                  for t in ANSWER_TOKENS + (THINK_TOKENS if think else [])])
  return transformers.PreTrainedTokenizerFast(
      tokenizer_object=tok, bos_token=None, eos_token="<|im_end|>",
      pad_token="<|endoftext|>", unk_token=None, chat_template=CHAT_TEMPLATE,
      model_max_length=4096, clean_up_tokenization_spaces=False)


def build(out_dir: str = DEFAULT_MODEL_DIR, seed: int = 0, warm_start_steps: int = WARM_START_STEPS,
          layers: int = LAYERS, heads: int = HEADS, rope_theta: float = ROPE_THETA,
          think: bool = False, sokoban_neighbours: bool = True) -> str:
  """The default model (or, with other `layers` / `heads` / `rope_theta`, a variant)
  built and warm started in `out_dir`.

  `think`: FrozenLake responses open with `<think>` what lies next to P `</think>`
  (warm_start.think_response; two more added tokens) before the random answer.
  `sokoban_neighbours`: SimpleSokoban's warm-start boards carry the neighbour line
  (warm_start.warm_start_envs; the shipped recipe; False: the earlier one, whose
  Sokoban boards had no line)."""
  from rollx.models import hf, llm
  from rollx.recipes import warm_start
  if heads < 1 or HIDDEN % heads:
    raise ValueError(f"make_default.build: heads={heads} must divide the hidden size {HIDDEN}")
  tokenizer = build_tokenizer(think)
  config = llm.ModelConfig(
      vocab_size=-(-len(tokenizer) // 128) * 128, hidden_size=HIDDEN, intermediate_size=3 * HIDDEN,
      num_layers=layers, num_heads=heads, num_kv_heads=max(1, heads // 2),
      head_dim=HIDDEN // heads, rope_theta=rope_theta, rms_norm_eps=1e-6,
      tie_word_embeddings=True, qkv_bias=True, max_position_embeddings=4096,
      architecture="Qwen2ForCausalLM", eos_token_id=tokenizer.eos_token_id,
      pad_token_id=tokenizer.pad_token_id)
  params = llm.init_params(llm.make_model(config), jax.random.PRNGKey(seed))
  hf.save_pretrained(jax.device_get(params), config, out_dir, tokenizer=tokenizer)
  print(f"wrote {out_dir}: {config.num_params / 1e6:.2f}M params, vocab {len(tokenizer)}")
  if warm_start_steps:
    warm_start.warm_start(out_dir, steps=warm_start_steps, seed=seed,
                          entries=warm_start.warm_start_envs(sokoban_neighbours),
                          think_tags=("FrozenLake", "FrozenLakeMultiTurn") if think else ())
  return out_dir


def main(argv):
  del argv
  FLAGS = flags.FLAGS
  build(FLAGS.out_dir, sokoban_neighbours=FLAGS.sokoban_neighbours)


if __name__ == "__main__":
  # flags only when run as a script: importing this module must not claim flag names
  from absl import app, flags
  flags.DEFINE_string("out_dir", DEFAULT_MODEL_DIR, "where to write the model (default: the "
                      "shipped default model directory)")
  flags.DEFINE_bool("sokoban_neighbours", True, "warm start SimpleSokoban with the "
                    "neighbour line (the shipped recipe; --nosokoban_neighbours: the "
                    "earlier one)")
  app.run(main)
