"""The tool loop, token-exact under real chat templates (Qwen2.5, Llama 3.2, Qwen3, and the
shipped default's), on a reasoning-gym task with the calculator and the Python sandbox."""

import asyncio
import copy
import json
import os
import subprocess
import sys
import types

import numpy as np
import pytest

import envs
from rollx import checks, config as config_lib
from rollx.models import DEFAULT_MODEL_DIR, hf
from rollx.rollout import agent_loops, chat
from rollx.rollout.types import Ticket, collate

TEMPLATES = os.path.join(os.path.dirname(__file__), os.pardir, "fixtures", "chat_templates")
# family -> (template file or None for the shipped one, special tokens, eos)
FAMILIES = {
    "default": (None, [], "<|im_end|>"),
    "qwen2.5": ("qwen2.5.jinja", ["<|im_start|>", "<|im_end|>"], "<|im_end|>"),
    "llama3.2": ("llama3.2.jinja", ["<|begin_of_text|>", "<|start_header_id|>",
                                    "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>"], "<|eot_id|>"),
    "qwen3": ("qwen3.jinja", ["<|im_start|>", "<|im_end|>"], "<|im_end|>"),
}


def tokenizer_for(family):
  """The shipped byte-level tokenizer (any text encodes) dressed as `family`: its special
  tokens, EOS and real chat template; built offline."""
  tok = copy.deepcopy(hf.load_tokenizer(DEFAULT_MODEL_DIR))
  path, special, eos = FAMILIES[family]
  if path:
    tok.add_special_tokens({"additional_special_tokens": special})
    tok.chat_template = open(os.path.join(TEMPLATES, path)).read()
    tok.eos_token = eos
    if family.startswith("llama"):
      tok.bos_token = "<|begin_of_text|>"
  tok.name_or_path = family
  return tok


def tool_entry(**overrides):
  entry = config_lib.env_entry(
      "ReasoningTask", env_config=dict(datasets=("basic_arithmetic",)), max_tokens_per_step=400,
      system_prompt="You are a careful solver.", agent_loop="tool",
      tools=("calculator", "python"), max_turns=6, max_tool_response_length=64)
  entry.update(overrides)
  return entry.to_dict()


class Script:
  """A scripted model: returns the ids of its next response (+ EOS unless `cut`), and
  records every prompt it was served."""

  def __init__(self, tokenizer, responses, cut=()):
    self.tok, self.responses, self.cut, self.prompts, self.outputs = tokenizer, responses, cut, [], []

  async def __call__(self, request_id, prompt_ids, max_tokens, **_):
    turn = len(self.prompts)
    self.prompts.append(list(prompt_ids))
    ids = self.tok.encode(self.responses[turn], add_special_tokens=False)
    if turn not in self.cut:
      ids += [self.tok.eos_token_id]
    ids = ids[:max_tokens]
    self.outputs.append(ids)
    return types.SimpleNamespace(token_ids=ids, token_versions=[7] * len(ids), policy_version=7,
                                 behaviour_logp=[-0.5] * len(ids))


def calls(*pairs):
  return "".join(f'<tool_call>\n{json.dumps({"name": n, "arguments": a})}\n</tool_call>'
                 for n, a in pairs)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_three_turn_tool_episode_with_parallel_calls_is_token_exact(family):
  tok = tokenizer_for(family)
  think = "<think>\nadd the terms\n</think>\n\n" if family == "qwen3" else ""
  loop = agent_loops.make_agent_loop(0, "Task", tool_entry(), tok, None, sequence_length=4000)
  env = loop.env
  env.reset(seed=11)
  answer = env.entry["answer"]
  # (Qwen3 thinks first in every response, as in its thinking mode)
  responses = [think + r for r in [
      "Two tools at once.\n" + calls(("calculator", {"expression": "2 ** 70"}),
                                     ("python", {"code": "x = 6 * 7\nx"})),
      calls(("python", {"code": "print(x + 1)"}), ("calculator", {"expression": "1 /"}),
            ("search", {"q": "x"})),
      calls(("python", {"code": "print('z' * 5000)"})),  # cut to 64 tokens
      f"The answer is <answer>{answer}</answer>",
  ]]
  script = Script(tok, responses)
  loop.generate = script
  traj = asyncio.run(loop.run_episode(Ticket(0, "Task", 0, 0, 11)))
  assert traj.finish == "terminated" and traj.score == 1.0 and traj.success
  (sample,) = traj.samples
  ids, mask = sample.input_ids, sample.response_mask
  # training ids == what the servers were served + what they generated, in order
  for prompt, out, nxt in zip(script.prompts, script.outputs, script.prompts[1:] + [ids]):
    assert nxt[:len(prompt) + len(out)] == prompt + out
  assert [i for i, m in zip(ids, mask) if m] == sum(script.outputs, [])
  assert all(v == 7 for v, m in zip(sample.token_versions, mask) if m)
  # decoding the whole sequence is the template's rendering of the conversation
  results = [t["tool_results"] for t in traj.transcript if t["action"] == "tool_call"]
  assert results[0] == [str(2 ** 70), "42"]
  assert results[1][0] == "43" and results[1][1].startswith("error: CalculatorError")
  assert results[1][2].startswith("error: unknown tool 'search'")
  assert "[truncated" in results[2][0]
  names = [["calculator", "python"], ["python", "calculator", "search"], ["python"]]
  messages = [{"role": "system", "content": "You are a careful solver.\n" + env.instructions},
              {"role": "user", "content": env.question}]
  for response, turn_results, turn_names in zip(responses, results, names):
    messages.append({"role": "assistant", "content": response})
    messages += [{"role": "tool", "name": n, "content": r} for n, r in zip(turn_names, turn_results)]
  messages.append({"role": "assistant", "content": responses[-1]})
  rendered = tok.apply_chat_template(messages, tools=loop.toolset.schemas(), tokenize=False)
  decoded = tok.decode(ids)  # ends with the generated EOS; the template may add a newline
  assert rendered[:len(decoded)] == decoded and rendered[len(decoded):] in ("", "\n")
  assert traj.tool_counts["calls"] == 6 and traj.tool_counts["tool_error"] == 1
  assert traj.tool_counts["unknown_tool"] == 1


def test_qwen3_drops_reasoning_at_a_new_user_turn_and_that_is_refused_by_name():
  template = chat.ChatTemplate(tokenizer_for("qwen3"))
  template.check_append_only(("tool",))  # tool results: append-only
  with pytest.raises(chat.TemplateNotAppendOnlyError, match="qwen3 is not append-only: adding user"):
    template.check_append_only(("user",))
  # a template that rewrites earlier assistant turns even for tool results: refused at start
  tok = tokenizer_for("qwen2.5")
  tok.chat_template = (
      "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' and not loop.last %}"
      "{{ m.content.split('</think>')[-1] }}{% else %}{{ m.content }}{% endif %}<|im_end|>\n"
      "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
  with pytest.raises(chat.TemplateNotAppendOnlyError, match="qwen2.5 is not append-only: adding tool"):
    agent_loops.make_agent_loop(0, "Task", tool_entry(), tok, None)


def test_a_cut_response_the_turn_limit_and_the_context_end_episodes_cleanly():
  tok = tokenizer_for("default")
  # cut at its token budget inside a call: a bad_json error the model reads, then the limit
  loop = agent_loops.make_agent_loop(0, "Task", tool_entry(max_turns=2), tok, None,
                                     sequence_length=4000)
  loop.generate = Script(tok, ['<tool_call>\n{"name": "calculator", "argu', "no answer"], cut=(0,))
  traj = asyncio.run(loop.run_episode(Ticket(0, "Task", 0, 0, 3)))
  assert traj.transcript[0]["tool_errors"] == ["bad_json"]
  assert traj.finish == "truncated" and traj.num_invalid_actions == 1 and traj.score == 0.0
  decoded = tok.decode(traj.samples[0].input_ids)
  assert '"argu<|im_end|>\n<|im_start|>user\n<tool_response>\nerror: the tool call is not' in decoded
  # out of context: a long tool result leaves no room for the next response
  loop = agent_loops.make_agent_loop(0, "Task", tool_entry(max_tool_response_length=1000), tok,
                                     None, sequence_length=900)
  loop.generate = Script(tok, [calls(("python", {"code": "print('w ' * 2000)"}))] * 6)
  traj = asyncio.run(loop.run_episode(Ticket(0, "Task", 0, 0, 3)))
  assert traj.finish == "length" and len(traj.samples[0].input_ids) <= 900


def test_tool_configs_are_checked_by_name():
  c = config_lib.load_file(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir,
                                        "configs", "frozenlake.py"))
  c.custom_envs.FrozenLake.tools = ("calculator",)
  c.custom_envs.Bad = config_lib.env_entry("ReasoningTask", agent_loop="robot", tools=("abacus",))
  with pytest.raises(config_lib.ConfigError) as e:
    checks.validate(c)
  errors = dict(e.value.errors)
  assert "never calls tools" in errors["custom_envs.FrozenLake.tools"]
  assert "unknown agent loop 'robot'" in errors["custom_envs.Bad.agent_loop"]
  assert "unknown tool 'abacus'" in errors["custom_envs.Bad.tools"]
  with pytest.raises(ValueError, match="unknown reasoning-gym|'no_such_family'"):
    envs.make_env("ReasoningTask", {"datasets": ("no_such_family",)})


def test_an_mcp_servers_tools_join_the_tool_set_and_answer_calls():
  import sys
  server = f"{sys.executable} {os.path.join(TEMPLATES, os.pardir, 'mcp_server.py')}"
  tok = tokenizer_for("qwen2.5")
  loop = agent_loops.make_agent_loop(0, "Task", tool_entry(tools=("calculator",), mcp_servers=(server,)),
                                     tok, None, sequence_length=4000)
  names = [s["function"]["name"] for s in loop.toolset.schemas()]
  assert names == ["calculator", "add", "shout", "hang"]
  add = loop.toolset.tools["add"]
  assert add.parameters["required"] == ["a", "b"] and add.description == "Adds two integers."
  env = loop.env
  env.reset(seed=5)
  loop.generate = Script(tok, [
      calls(("add", {"a": 2, "b": 40}), ("shout", {"text": "hi"}), ("shout", {"text": ""}),
            ("add", {"a": "x"})),
      calls(("add", {"a": 1, "b": 2})),  # the same server process, a second round
      f"<answer>{env.entry['answer']}</answer>"])
  traj = asyncio.run(loop.run_episode(Ticket(0, "Task", 0, 0, 5)))
  first, second = [t for t in traj.transcript if t["action"] == "tool_call"]
  assert first["tool_results"][:2] == ["42", "HI"]
  assert first["tool_errors"] == [None, None, "tool_error", "bad_arguments"]
  assert "nothing to shout" in first["tool_results"][2]
  assert second["tool_results"] == ["3"] and traj.success
  with pytest.raises(ValueError, match="mcp_servers: 'nonexistent-mcp-command' did not list"):
    agent_loops.make_agent_loop(0, "Task", tool_entry(mcp_servers=("nonexistent-mcp-command",)),
                                tok, None)


def test_rollx_play_prints_each_tool_call_and_result():
  # (rollx.play itself defines command-line flags at import: its describe_turn is here)
  tok = tokenizer_for("default")
  printed = []
  loop = agent_loops.make_agent_loop(
      0, "Task", tool_entry(), tok, None, sequence_length=4000,
      on_turn=lambda manager, record: printed.append(agent_loops.describe_turn(tok, record)))
  loop.generate = Script(tok, [calls(("calculator", {"expression": "6 * 7"})), "<answer>42</answer>"])
  asyncio.run(loop.run_episode(Ticket(0, "Task", 0, 0, 1)))
  out = "\n".join(printed)
  assert "[tool call] calculator {'expression': '6 * 7'}\n[tool result] '42'" in out
  assert "[action] tool_call" in out and "[action] 42" in out


def test_tool_demonstrations_solve_other_families_through_the_real_loop(tmp_path):
  from rollx.recipes import tool_demos, warm_start
  config = checks.validate(config_lib.load_file(os.path.join(
      os.path.dirname(__file__), os.pardir, os.pardir, "configs", "tool_arithmetic.py")))
  tok = hf.load_tokenizer(DEFAULT_MODEL_DIR)
  episodes = tool_demos.demonstration_episodes(
      tok, config.custom_envs.Arithmetic.to_dict(), 6, seed=0, sequence_length=1024)
  assert len(episodes) == 6 and all(t.success and t.score == 1.0 for t in episodes)
  for t in episodes:
    call, answer = t.transcript
    assert call["action"] == "tool_call" and call["tool_errors"] == [None]
    assert answer["action"] == call["tool_results"][0]  # the answer is the tool's result
    question = t.transcript[0]["observation"]
    assert question.startswith(("State the final answer", "Solve the following multiplication"))
  assert not tool_demos.demo_families_overlap(config.custom_envs.Arithmetic.env_config.datasets)
  # the warm start learns the calls and answers, not the constant system prompt
  samples = collate(episodes, 1024)
  mask = warm_start.loss_mask(samples, responses_only=True)
  for row, t in enumerate(episodes):
    learned = tok.decode(samples.input_ids[row][mask[row] > 0])
    answer = t.transcript[-1]
    assert learned.startswith('<tool_call>\n{"name": "calculator"'), learned
    assert learned.endswith(f"<answer>{answer['action']}</answer><|im_end|>"), learned
    assert "# Tools" not in learned and "<tool_response>" not in learned
  assert warm_start.loss_mask(samples).sum() == samples.segment_ids.sum() - len(episodes)
  # tool demonstrations beside game transcripts: each row trained its own way (the
  # demonstrations on their calls and answers, the games on the whole transcript)
  game = warm_start.random_valid_episodes(tok, warm_start.WARM_START_ENVS[:1], 2, seed=0)
  mixed = collate(episodes[:2] + game, 1024)
  mask = warm_start.loss_mask(mixed, responses_only=(tool_demos.DEMO_TAG,))
  np.testing.assert_array_equal(mask[:2], warm_start.loss_mask(mixed, True)[:2])
  np.testing.assert_array_equal(mask[2:], warm_start.loss_mask(mixed, False)[2:])
  assert mask[2:].sum() > mixed.response_mask[2:].sum()  # the boards are learned too
  config.output_dir = str(tmp_path)
  config.warm_start_steps = 1
  config.custom_envs.Arithmetic.env_config.datasets = ("products",)
  with pytest.raises(ValueError, match=r"Arithmetic.env_config.datasets: \['products'\]"):
    warm_start.build(config, str(tmp_path / "start"))
  assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("in_the_loop", [False, True])
def test_copy_pretraining_samples_copy_their_prompt_and_teach_no_task(in_the_loop):
  """Short rows (stage 1), or rows that open as the tool config's episodes open (stage 2:
  the system prompt and tool list ids the loop itself renders, mask 0)."""
  import re
  from rollx.recipes import tool_demos
  tok = hf.load_tokenizer(DEFAULT_MODEL_DIR)
  entry = None
  if in_the_loop:
    entry = config_lib.load_file(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir,
                                              "configs", "tool_arithmetic.py"))
    entry = entry.custom_envs.Arithmetic.to_dict()
    loop = agent_loops.make_agent_loop(0, "Arithmetic", entry, tok, None, sequence_length=1024)
  episodes = tool_demos.copy_episodes(tok, 60, seed=0, entry=entry)
  again = tool_demos.copy_episodes(tok, 60, seed=0, entry=entry)
  assert [t.samples[0].input_ids for t in episodes] == [t.samples[0].input_ids for t in again]
  kinds = set()
  for t in episodes:
    assert t.ticket.tag == tool_demos.COPY_TAG
    (s,) = t.samples
    text = tok.decode(s.input_ids)
    learned = tok.decode([i for i, m in zip(s.input_ids, s.response_mask) if m])
    asked = text.split("<|im_start|>user\n", 2)[1].split("<|im_end|>")[0]
    if in_the_loop:
      opening = loop.conversation(asked).prompt_ids()
      assert s.input_ids[:len(opening)] == opening and not any(s.response_mask[:len(opening)])
      assert text.startswith(f"<|im_start|>system\n{entry['system_prompt']}") and "<tools>" in text
    else:
      assert text.startswith("<|im_start|>user\n")  # no system prompt, no tool list
    # no reasoning-gym family's wording (the RL and demonstration tasks)
    assert not asked.startswith(("Calculate", "State the final answer", "Solve the following"))
    if asked.startswith("Repeat: "):
      kinds.add("repeat")
      assert learned == asked[len("Repeat: "):] + "<|im_end|>"
      continue
    kinds.add("call")
    call, answer = re.fullmatch(r"<tool_call>\n(.*)\n</tool_call><\|im_end\|>"
                                r"<answer>(.*)</answer><\|im_end\|>", learned).groups()
    expression = json.loads(call)["arguments"]["expression"]
    assert asked.endswith((expression, expression + ".", expression + " =", expression + "?"))
    assert f"<tool_response>\n{answer}\n</tool_response>" in text  # read back, not computed
  assert kinds == {"repeat", "call"}


def test_the_tool_model_recipe_runs_both_stages(tmp_path):
  """`python -m rollx.recipes.tool_start` in miniature (two steps a stage): copy
  pretraining, then the config's warm start on demonstrations and copy samples; the
  result is an HF directory that the tool config can start from."""
  from safetensors.numpy import load_file
  from rollx.recipes import tool_start
  from tests.conftest import ROOT
  out = tool_start.build_default_tools(str(tmp_path / "tools"),
                                       os.path.join(ROOT, "configs", "tool_arithmetic.py"),
                                       steps=2, copy_steps=2)  # step 0 is warm-up (lr 0)
  before = load_file(os.path.join(DEFAULT_MODEL_DIR, "model.safetensors"))
  after = load_file(os.path.join(out, "model.safetensors"))
  assert any(not np.array_equal(before[k], after[k]) for k in before)
  assert hf.load_tokenizer(out).chat_template == hf.load_tokenizer(DEFAULT_MODEL_DIR).chat_template
  assert sorted(os.listdir(tmp_path)) == ["tools"]  # the stages' directories are gone


def train_arithmetic(config_name, steps, out):
  """`python -m rollx.train --config=configs/<config_name>.py` for `steps` steps at a
  quarter of its training batch and a sixteenth of its validation set (the suite's
  minutes), everything written under `out`."""
  from tests.conftest import ROOT
  from tests.test_pipeline import train_env
  smaller = ["--config.rollout_batch_size=8", "--config.train_env_manager.num_env_groups=2",
             "--config.train_env_manager.group_size=4", "--config.val_batch_size=4",
             "--config.val_env_manager.num_env_groups=4"]
  return subprocess.run(
      [sys.executable, "-m", "rollx.train", f"--config=configs/{config_name}.py",
       f"--config.max_steps={steps}", *smaller, f"--config.output_dir={out}",
       f"--config.logging_dir={out}/logs"],
      cwd=ROOT, capture_output=True, text=True, timeout=480, env=train_env())


def test_two_training_steps_of_the_shipped_tool_config(tmp_path):
  """`python -m rollx.train --config=configs/tool_arithmetic.py --config.max_steps=2`, as a
  user runs it (from the shipped tool-warm-started model), at a quarter of its training
  batch and a sixteenth of its validation set (the suite's minutes): the servers, the tool
  loop with its sandboxed tools in Ray env workers, the trainer; tool metrics reach
  TensorBoard, and a later turn of a conversation continues its cached keys/values (KV
  reuse across turns) instead of prefilling the ~400-token system prompt and tool list
  again."""
  from tests.test_pipeline import tb_scalars
  out = tmp_path / "run"
  result = train_arithmetic("tool_arithmetic", 2, out)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "step 2/2" in result.stdout, result.stdout[-3000:]
  scalars = tb_scalars(out / "logs" / "tool_arithmetic_grpo")
  assert any(k.endswith("Arithmetic/tool_calls_per_episode") for k in scalars), sorted(scalars)
  assert any("ArithmeticVal/success" in k for k in scalars), sorted(scalars)
  # each step's turns: every first turn prefills the whole prompt, every later one only
  # the ids appended since (the tool results and the next generation prompt)
  reused = scalars["rollout/reused_tokens_per_turn"]
  assert sorted(reused) == [0, 1] and all(v > 100 for v in reused.values()), reused
  assert all(v > 0 for v in scalars["rollout/prefill_tokens_per_turn"].values())
