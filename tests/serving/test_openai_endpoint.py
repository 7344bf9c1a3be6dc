"""The OpenAI-compatible endpoint: the official `openai` client and a LangGraph agent
against `python -m rollx.serve --openai_port` (real JetStream server, real model), and
the token-exact recording of what they called."""

import asyncio
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import types

import httpx
import openai
import pytest

from rollx import models
from rollx.models import hf
from rollx.recipes import warm_start
from rollx.rollout import recording
from rollx.rollout.types import Sample, Ticket, Trajectory
from rollx.serving import openai_endpoint
from tests.conftest import ROOT
from tests.serving.test_serving import _free_port

QUESTION = "What is 12*34?"
CALL_TEXT = '<tool_call>\n{"name": "multiply", "arguments": {"a": 12, "b": 34}}\n</tool_call>'
ANSWER_TEXT = "<answer>408</answer>"
SERVE_FLAGS = ["--config.actor_infer.strategy_args.max_concurrent_decodes=16",
               "--config.actor_infer.strategy_args.max_prefill_length=512",
               "--config.actor_infer.strategy_args.max_cache_length=640",
               "--config.sequence_length=640"]


def multiply_tool():
  """A LangChain tool: what the LangGraph agent binds (short: the default tokenizer
  spells JSON schemas out nearly a character a token)."""
  from langchain_core.tools import StructuredTool

  async def multiply(a: int, b: int) -> str:
    return str(a * b)

  return StructuredTool.from_function(coroutine=multiply, name="multiply",
                                      description="Multiplies a by b.")


def tool_schemas():
  from langchain_core.utils.function_calling import convert_to_openai_tool
  return [convert_to_openai_tool(multiply_tool())]


def taught_conversation():
  return [{"role": "user", "content": QUESTION},
          {"role": "assistant", "content": CALL_TEXT},
          {"role": "tool", "content": "408"},
          {"role": "assistant", "content": ANSWER_TEXT}]


@pytest.fixture(scope="module")
def taught_model(tmp_path_factory):
  """The default model taught one tool-use conversation (asked QUESTION with the
  multiply tool, it calls it, then answers from the result): a real model that emits a
  tool call, built offline in seconds. Elsewhere it writes what the default writes."""
  out = str(tmp_path_factory.mktemp("taught"))
  shutil.copytree(models.DEFAULT_MODEL_DIR, out, dirs_exist_ok=True)
  tok = hf.load_tokenizer(out)
  ids = tok.encode(tok.apply_chat_template(taught_conversation(), tools=tool_schemas(),
                                           tokenize=False).rstrip("\n"),
                   add_special_tokens=False)
  sample = Sample(ids, [1] * len(ids), [-1] * len(ids), 0.0)
  episode = Trajectory(Ticket(0, "taught", 0, 0, 0), [sample], 0.0, False, 2, 0,
                       "terminated", -1)
  warm_start.warm_start(out, steps=150, batch_size=1, learning_rate=3e-3, episodes=[episode],
                        sequence_length=512, log_every=0)
  return out


@pytest.fixture(scope="module")
def serve(taught_model, tmp_path_factory):
  """`python -m rollx.serve --openai_port` over the taught model: its /v1 base URL."""
  port = _free_port()
  log = tmp_path_factory.mktemp("serve") / "stderr"
  with open(log, "w") as stderr:  # a file, not a pipe: nobody reads the server's logs
    proc = subprocess.Popen(
        [sys.executable, "-m", "rollx.serve", "--config=configs/frozenlake.py",
         f"--config.pretrain={taught_model}", f"--openai_port={port}", *SERVE_FLAGS],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=stderr, text=True)
  lines = []
  while not lines or "openai endpoint on" not in lines[-1]:
    lines.append(proc.stdout.readline())
    if not lines[-1] and proc.poll() is not None:
      raise RuntimeError(f"rollx.serve exited: {log.read_text()[-2000:]}")
  grpc_address = next(l.split()[-1] for l in lines if l.startswith("serving on"))
  yield types.SimpleNamespace(url=lines[-1].split()[-1], grpc=grpc_address)
  proc.terminate()
  assert proc.wait(timeout=30) == 0, log.read_text()[-2000:]


def client(url, **kwargs):
  return openai.OpenAI(base_url=url, api_key="unused", max_retries=0, **kwargs)


def recorded(url, episode):
  root = url.rsplit("/v1", 1)[0]
  return httpx.get(f"{root}/episodes/{episode}").json()


def test_models_completion_stream_and_tool_calls_with_the_openai_client(serve, taught_model):
  c = client(serve.url)
  assert [m.id for m in c.models.list()] == [os.path.basename(taught_model)]
  reply = c.chat.completions.create(model="any", messages=[{"role": "user", "content": "hi"}],
                                    max_tokens=6, temperature=0)
  assert reply.object == "chat.completion" and reply.choices[0].finish_reason in ("stop", "length")
  assert reply.usage.completion_tokens <= 6
  assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
  chunks = list(c.chat.completions.create(
      model="any", messages=[{"role": "user", "content": "hi"}], max_tokens=6, temperature=0,
      stream=True, stream_options={"include_usage": True}))
  streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
  assert streamed == (reply.choices[0].message.content or "")  # greedy: the same reply
  assert chunks[-1].usage.completion_tokens == reply.usage.completion_tokens
  # asked the taught question with the calculator: a tool call whose arguments parse
  tools = tool_schemas()
  reply = c.chat.completions.create(model="any", messages=[{"role": "user", "content": QUESTION}],
                                    tools=tools, temperature=0, max_tokens=96)
  choice = reply.choices[0]
  assert choice.finish_reason == "tool_calls", choice.message
  call, = choice.message.tool_calls
  assert call.function.name == "multiply"
  assert json.loads(call.function.arguments) == {"a": 12, "b": 34}
  streamed = list(c.chat.completions.create(
      model="any", messages=[{"role": "user", "content": QUESTION}], tools=tools,
      temperature=0, max_tokens=96, stream=True))
  deltas = [d for ch in streamed for d in (ch.choices[0].delta.tool_calls or ())]
  assert deltas[0].function.name == "multiply"
  assert json.loads("".join(d.function.arguments or "" for d in deltas)) == {"a": 12, "b": 34}
  assert streamed[-1].choices[0].finish_reason == "tool_calls"
  # tool_choice="none": the same text, left as content
  reply = c.chat.completions.create(model="any", messages=[{"role": "user", "content": QUESTION}],
                                    tools=tools, tool_choice="none", temperature=0, max_tokens=96)
  assert reply.choices[0].message.tool_calls is None
  assert reply.choices[0].message.content == CALL_TEXT
  # stop: cut before the stop text; the seed makes sampled replies repeat
  reply = c.chat.completions.create(model="any", messages=[{"role": "user", "content": QUESTION}],
                                    tools=tools, temperature=0, max_tokens=96, stop=["multi"])
  assert reply.choices[0].message.content == CALL_TEXT[:CALL_TEXT.index("multi")]
  assert reply.choices[0].finish_reason == "stop"
  sampled = [c.chat.completions.create(model="any", messages=[{"role": "user", "content": "x"}],
                                       max_tokens=12, seed=s).choices[0].message.content
             for s in (7, 7, 8)]
  assert sampled[0] == sampled[1]


@pytest.mark.parametrize("body,param,code", [
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role", None),
    ({"model": "m"}, "messages", None),
    ({"messages": []}, "messages", None),
    ({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, "temperature", None),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens", None),
    ({"messages": [{"role": "user", "content": "x"}], "n": 2}, "n", None),
    ({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}, "tool_choice",
     None),
    ({"messages": [{"role": "user", "content": "ab " * 600}]}, "messages",
     "context_length_exceeded"),
    # a field is honoured or refused by name, never ignored
    ({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}},
     "response_format", "unsupported_parameter"),
    ({"messages": [{"role": "user", "content": "x"}], "presence_penalty": 0.5},
     "presence_penalty", "unsupported_parameter"),
    ({"messages": [{"role": "user", "content": "x"}], "frequency_penalty": 1.0},
     "frequency_penalty", "unsupported_parameter"),
    ({"messages": [{"role": "user", "content": "x"}], "logit_bias": {"5": 10}}, "logit_bias",
     "unsupported_parameter"),
    ({"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 3},
     "top_logprobs", "unsupported_parameter"),
    ({"messages": [{"role": "user", "content": "x"}], "logprobs": True, "stream": True},
     "logprobs", "unsupported_parameter"),
    ({"messages": [{"role": "user", "content": "x"}], "functions": [{"name": "f"}]}, "functions",
     "unsupported_parameter"),
])
def test_bad_requests_get_openais_error_object_naming_the_field(serve, body, param, code):
  with pytest.raises(openai.BadRequestError) as e:  # the client's own request path, raw body
    client(serve.url).post("/chat/completions", body={"model": "m", **body}, cast_to=object)
  error = e.value.body
  assert e.value.status_code == 400 and error["type"] == "invalid_request_error"
  assert error["param"] == param and error["code"] == code, error
  # malformed JSON too, and the endpoint keeps serving
  r = httpx.post(f"{serve.url}/chat/completions", content=b'{"messages": [',
                 headers={"content-type": "application/json"})
  assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
  assert client(serve.url).chat.completions.create(
      model="m", messages=[{"role": "user", "content": "x"}], max_tokens=2).choices


def test_logprobs_are_the_sampled_tokens_and_unknown_routes_answer_openais_error(serve):
  reply = client(serve.url).chat.completions.create(
      model="m", messages=[{"role": "user", "content": "x"}], max_tokens=8, logprobs=True,
      top_logprobs=0, parallel_tool_calls=True, user="agent-7")
  content = reply.choices[0].logprobs.content
  assert 1 <= len(content) <= reply.usage.completion_tokens
  assert "".join(t.token for t in content) == (reply.choices[0].message.content or "")
  assert all(t.logprob <= 0 and t.bytes == list(t.token.encode()) for t in content)
  plain = client(serve.url).chat.completions.create(
      model="m", messages=[{"role": "user", "content": "x"}], max_tokens=2)
  assert plain.choices[0].logprobs is None
  root = serve.url.rsplit("/v1", 1)[0]
  for method, path, status, code in (("GET", "/v1/nothing", 404, "not_found"),
                                     ("GET", "/v1/chat/completions", 405, "method_not_allowed"),
                                     ("PUT", "/episodes/e1", 405, "method_not_allowed")):
    r = httpx.request(method, root + path)
    assert r.status_code == status and r.json()["error"]["code"] == code, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"


def scripted_endpoint(text, **kwargs):
  """An endpoint whose generator returns the ids of `text` (no end-of-turn): what a
  server returns for a reply it stopped at max_tokens."""
  tok = hf.load_tokenizer(models.DEFAULT_MODEL_DIR)
  ids = tok.encode(text, add_special_tokens=False)

  async def generate(request_id, prompt_ids, max_tokens, **_):
    out = ids[:max_tokens]
    return types.SimpleNamespace(token_ids=out, token_versions=[0] * len(out),
                                 policy_version=0, behaviour_logp=[-0.25] * len(out))

  return openai_endpoint.OpenAIEndpoint(generate, tok, **kwargs), len(ids)


def test_a_reply_cut_inside_a_tool_call_is_length_with_its_text_and_usage_counts_all():
  text = '<tool_call>\n{"name": "multiply", "arguments": {"a": 12, "b"'

  async def go():
    endpoint, n = scripted_endpoint(text)
    await endpoint.start()
    api = openai.AsyncOpenAI(base_url=endpoint.base_url, api_key="-", max_retries=0)
    try:
      cut = await api.chat.completions.create(
          model="m", messages=[{"role": "user", "content": "x"}], tools=tool_schemas(),
          max_tokens=n)
      stopped = await api.chat.completions.create(
          model="m", messages=[{"role": "user", "content": "x"}], max_tokens=n,
          stop=['"name"'])
    finally:
      await endpoint.stop()
    return cut, stopped, n

  cut, stopped, n = asyncio.run(go())
  choice = cut.choices[0]
  assert choice.finish_reason == "length" and not choice.message.tool_calls
  assert choice.message.content == text
  assert stopped.choices[0].message.content == "<tool_call>\n{"
  assert stopped.usage.completion_tokens == n  # generated, not only the kept ids


def test_64_concurrent_sessions_record_their_own_calls(serve):
  """Each session: a first call, then a second that appends the reply and a user turn.
  Every recording is one sample: its first prompt, its reply ids, the template's ids,
  its second reply, nothing of any other session's."""
  async def session(i):
    episode = f"s{i}"
    c = openai.AsyncOpenAI(base_url=f"{serve.url.rsplit('/v1', 1)[0]}/episodes/{episode}/v1",
                           api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": f"session {i} move"}]
    first = await c.chat.completions.create(model="m", messages=messages, max_tokens=6)
    messages += [{"role": "assistant", "content": first.choices[0].message.content or ""},
                 {"role": "user", "content": f"again {i}"}]
    second = await c.chat.completions.create(model="m", messages=messages, max_tokens=6)
    return messages, first, second

  async def all_sessions():
    return await asyncio.gather(*(session(i) for i in range(64)))

  results = asyncio.run(all_sessions())
  tok = hf.load_tokenizer(models.DEFAULT_MODEL_DIR)
  for i, (messages, first, second) in enumerate(results):
    rec = recorded(serve.url, f"s{i}")
    assert sum(rec["breaks"].values()) == 0
    (sample,), calls = rec["samples"], rec["calls"]
    assert len(calls) == 2
    one, two = calls
    assert tok.decode(one["prompt_ids"]).count(f"session {i} move") == 1
    assert two["prompt_ids"][:len(one["prompt_ids"]) + len(one["response_ids"])] == \
        one["prompt_ids"] + one["response_ids"]
    assert sample["input_ids"] == two["prompt_ids"] + two["response_ids"]
    assert f"again {i}" in tok.decode(sample["input_ids"])
    assert [t for t, m in zip(sample["input_ids"], sample["response_mask"]) if m] == \
        one["response_ids"] + two["response_ids"]
    assert len(one["response_ids"]) == first.usage.completion_tokens
    assert len(two["response_ids"]) == second.usage.completion_tokens
    assert tok.decode(one["response_ids"], skip_special_tokens=True) == \
        (first.choices[0].message.content or "")


def test_a_langgraph_agent_episode_is_recorded_token_exactly(serve):
  """LangGraph's prebuilt ReAct agent over langchain-openai's chat model: it calls the
  tool (run by LangGraph), reads the result and answers. The recorded sample is
  the served ids plus template ids, decodes to the conversation LangGraph saw, and its
  mask covers exactly what the server generated."""
  from langchain_openai import ChatOpenAI
  from langgraph.prebuilt import create_react_agent
  url = f"{serve.url.rsplit('/v1', 1)[0]}/episodes/lg/v1"
  model = ChatOpenAI(base_url=url, api_key="unused", model="m", temperature=0, max_retries=0)
  agent = create_react_agent(model, [multiply_tool()])
  state = asyncio.run(agent.ainvoke({"messages": [("user", QUESTION)]}))
  kinds = [type(m).__name__ for m in state["messages"]]
  assert kinds == ["HumanMessage", "AIMessage", "ToolMessage", "AIMessage"], kinds
  assert state["messages"][1].tool_calls[0]["args"] == {"a": 12, "b": 34}
  assert state["messages"][2].content == "408"
  assert state["messages"][3].content == ANSWER_TEXT
  rec = recorded(serve.url, "lg")
  (sample,), (one, two) = rec["samples"], rec["calls"]
  assert sum(rec["breaks"].values()) == 0
  ids, mask = sample["input_ids"], sample["response_mask"]
  # served ids: the second prompt extends the first prompt and reply verbatim
  assert two["prompt_ids"][:len(one["prompt_ids"]) + len(one["response_ids"])] == \
      one["prompt_ids"] + one["response_ids"]
  assert ids == two["prompt_ids"] + two["response_ids"]
  assert [t for t, m in zip(ids, mask) if m] == one["response_ids"] + two["response_ids"]
  # ... and decode to the template's rendering of what LangGraph saw
  tok = hf.load_tokenizer(models.DEFAULT_MODEL_DIR)
  seen = [recording.normalize_message(m) for m in [
      {"role": "user", "content": QUESTION},
      {"role": "assistant", "content": None, "tool_calls": [{"function": {
          "name": "multiply", "arguments": state["messages"][1].tool_calls[0]["args"]}}]},
      {"role": "tool", "content": "408"},
      {"role": "assistant", "content": ANSWER_TEXT}]]
  rendered = tok.apply_chat_template(seen, tools=tool_schemas(), tokenize=False)
  assert rendered == tok.decode(ids) + "\n"


def test_rewritten_history_starts_a_new_sample_and_counts_the_break(serve):
  episode_url = f"{serve.url.rsplit('/v1', 1)[0]}/episodes/rw/v1"
  c = client(episode_url)
  messages = [{"role": "user", "content": "first"}]
  reply = c.chat.completions.create(model="m", messages=messages, max_tokens=4)
  c.chat.completions.create(model="m", max_tokens=4, messages=[
      {"role": "user", "content": "a summary of it"}, {"role": "user", "content": "go on"}])
  rec = recorded(serve.url, "rw")
  assert rec["breaks"]["rewritten"] == 1 and len(rec["samples"]) == 2
  assert reply.choices


def test_no_live_server_is_503_and_auth_and_body_limits(tmp_path):
  """An endpoint whose rollout servers are all down answers 503; with an API key,
  a request without it is 401; an oversized body is 413; the endpoint stays up."""
  from rollx.serving.client import RolloutClient
  with pytest.raises(ValueError, match="API key"):
    openai_endpoint.OpenAIEndpoint(None, hf.load_tokenizer(models.DEFAULT_MODEL_DIR),
                                   host="0.0.0.0")
  dead = f"127.0.0.1:{_free_port()}"
  loop = asyncio.new_event_loop()
  endpoint = openai_endpoint.OpenAIEndpoint(
      RolloutClient([dead]).generate, hf.load_tokenizer(models.DEFAULT_MODEL_DIR),
      api_key="sekret", max_body_bytes=10_000)
  thread = threading.Thread(target=loop.run_forever, daemon=True)
  thread.start()
  asyncio.run_coroutine_threadsafe(endpoint.start(), loop).result(30)
  try:
    messages = [{"role": "user", "content": "x"}]
    with pytest.raises(openai.InternalServerError) as e:
      client(endpoint.base_url, ).with_options(api_key="sekret").chat.completions.create(
          model="m", messages=messages)
    assert e.value.status_code == 503 and e.value.body["code"] == "service_unavailable"
    with pytest.raises(openai.AuthenticationError):
      client(endpoint.base_url).chat.completions.create(model="m", messages=messages)
    r = httpx.post(f"{endpoint.base_url}/chat/completions", json={"messages": messages,
                                                                  "pad": "x" * 20_000},
                   headers={"authorization": "Bearer sekret"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    assert httpx.get(f"{endpoint.base_url}/models",
                     headers={"authorization": "Bearer sekret"}).status_code == 200
    root = endpoint.base_url.rsplit("/v1", 1)[0]  # the recordings need the key too
    for method in ("GET", "DELETE"):
      assert httpx.request(method, f"{root}/episodes/e1").status_code == 401
      r = httpx.request(method, f"{root}/episodes/e1", headers={"authorization": "Bearer sekret"})
      assert r.status_code == 404 and r.json()["error"]["code"] == "episode_not_found"
  finally:
    asyncio.run_coroutine_threadsafe(endpoint.stop(), loop).result(30)
    loop.call_soon_threadsafe(loop.stop)


# -- the `program` agent loop: the user's agent function, one run per episode ------------
async def answer_once(task):
  """One model call on the task; the env scores the reply."""
  c = openai.AsyncOpenAI(base_url=task.base_url, api_key=task.api_key, max_retries=0)
  await c.chat.completions.create(model=task.model, messages=[
      {"role": "user", "content": task.prompt}])


async def overflow(task):
  """A first call that fits, then one that cannot."""
  c = openai.AsyncOpenAI(base_url=task.base_url, api_key=task.api_key, max_retries=0)
  messages = [{"role": "user", "content": task.prompt}]
  reply = await c.chat.completions.create(model=task.model, messages=messages)
  messages += [{"role": "assistant", "content": reply.choices[0].message.content or ""},
               {"role": "user", "content": "more " * 400}]
  await c.chat.completions.create(model=task.model, messages=messages)
  raise AssertionError("the second call must be refused")


def run_program(serve, entry, seed=3):
  """One episode of `entry` (agent_loop 'program') against the served model."""
  from rollx.rollout.agent_loops import make_agent_loop
  from rollx.serving.client import RolloutClient
  tok = hf.load_tokenizer(models.DEFAULT_MODEL_DIR)  # the taught model's tokenizer

  async def go():
    client = RolloutClient([serve.grpc])
    endpoint = openai_endpoint.OpenAIEndpoint(client.generate, tok)
    loop = make_agent_loop(0, "T", entry, tok, client.generate, mode="train",
                           sequence_length=640, max_prompt_length=512, endpoint=endpoint)
    try:
      return await loop.run_episode(Ticket(0, "T", 0, 0, seed)), loop
    finally:
      await endpoint.stop()
      await client.close()

  return asyncio.run(go())


def test_openai_sdk_frozenlake_program_episode_is_one_token_exact_sample(serve):
  from configs import openai_frozenlake
  entry = openai_frozenlake.get_config().custom_envs.FrozenLake.to_dict()
  traj, loop = run_program(serve, entry)
  sample, = traj.samples
  responses = [r["response_ids"] for r in traj.transcript]
  assert sample.input_ids == traj.transcript[-1]["prompt_ids"] + responses[-1]
  assert [t for t, m in zip(sample.input_ids, sample.response_mask) if m] == sum(responses, [])
  assert all(v >= 0 for v, m in zip(sample.token_versions, sample.response_mask) if m)
  # the score is the env's: replaying the replies on the same map gives it again
  import envs
  env = envs.make_env(entry["env_type"], dict(entry["env_config"]))
  env.reset(seed=3)
  tok = hf.load_tokenizer(models.DEFAULT_MODEL_DIR)
  steps = [env.step(tok.decode(r, skip_special_tokens=True)) for r in responses]
  assert traj.score == pytest.approx(sum(s[1] for s in steps)) and sample.reward == traj.score
  _, _, terminated, truncated, _ = steps[-1]
  assert traj.num_turns == len(responses) and (terminated or truncated)
  assert traj.finish == ("terminated" if terminated else "truncated")


def test_a_program_that_answers_once_is_scored_by_the_env_and_one_that_overflows_ends(serve):
  from rollx import config as config_lib
  entry = config_lib.env_entry(
      "ReasoningTask", env_config=dict(datasets=("basic_arithmetic",)), max_tokens_per_step=16,
      agent_loop="program",
      agent_program="tests.serving.test_openai_endpoint:answer_once").to_dict()
  traj, loop = run_program(serve, entry)
  (sample,), (turn,) = traj.samples, traj.transcript
  env = loop.env
  env.reset(seed=3)
  _, reward, _, _, info = env.step(turn["response"])
  assert traj.score == reward and traj.success == info["success"]
  assert len(turn["response_ids"]) <= 16  # the entry's per-turn cap holds for programs too
  entry["agent_program"] = "tests.serving.test_openai_endpoint:overflow"
  traj, _ = run_program(serve, entry)
  assert traj.finish == "length" and traj.score == 0.0 and traj.num_turns == 1


def test_one_episode_cannot_take_more_than_its_share_of_concurrent_calls():
  """Calls of one episode beyond `max_concurrent_per_episode` get 429 at once; other
  episodes' and unrecorded calls are served meanwhile."""
  release = asyncio.Event()

  async def held_generate(request_id, prompt_ids, max_tokens, **kwargs):
    await release.wait()
    return types.SimpleNamespace(token_ids=[5, 6], token_versions=[0, 0], policy_version=0,
                                 behaviour_logp=[-0.5, -0.5])

  async def go():
    endpoint = openai_endpoint.OpenAIEndpoint(
        held_generate, hf.load_tokenizer(models.DEFAULT_MODEL_DIR), max_concurrent_per_episode=2)
    await endpoint.start()
    root = endpoint.base_url.rsplit("/v1", 1)[0]
    messages = [{"role": "user", "content": "x"}]
    a = openai.AsyncOpenAI(base_url=f"{root}/episodes/a/v1", api_key="-", max_retries=0)
    b = openai.AsyncOpenAI(base_url=f"{root}/episodes/b/v1", api_key="-", max_retries=0)
    anonymous = openai.AsyncOpenAI(base_url=endpoint.base_url, api_key="-", max_retries=0)
    held = [asyncio.ensure_future(a.chat.completions.create(model="m", messages=messages))
            for _ in range(2)]
    while endpoint._in_flight.get("a", 0) < 2:
      await asyncio.sleep(0.01)
    with pytest.raises(openai.RateLimitError) as e:
      await a.chat.completions.create(model="m", messages=messages)
    assert e.value.body["code"] == "rate_limit_exceeded"
    others = [asyncio.ensure_future(c.chat.completions.create(model="m", messages=messages))
              for c in (b, b, anonymous, anonymous, anonymous)]
    await asyncio.sleep(0.2)
    release.set()
    replies = await asyncio.gather(*held, *others)
    assert all(r.usage.completion_tokens == 2 for r in replies)
    assert endpoint._in_flight == {"": 0}
    assert len(endpoint.close_episode("a").calls) == 2
    await endpoint.stop()

  asyncio.run(go())


def test_an_env_workers_program_loops_share_one_endpoint_and_deliver_trajectories(serve):
  """The wiring `rollx.train` uses (rollx/rollout/env_worker.py; Ray hosts it): the
  worker's program envs get one endpoint, started with the first episode, and their
  trajectories reach the scheduler's `put`."""
  from rollx import config as config_lib
  from rollx.rollout.env_worker import EnvWorker
  config = config_lib.load_file(os.path.join(ROOT, "configs", "openai_frozenlake.py"))
  config.pretrain = None  # the default model's tokenizer (the taught model shares it)
  config.train_env_manager.num_env_groups = 1
  config.train_env_manager.group_size = 2

  class Link:  # the scheduler's side of the protocol: two tickets, then none
    def __init__(self):
      self.tickets = [Ticket(i, "FrozenLake", 0, i, 11) for i in range(2)]
      self.done = []

    async def next_ticket(self, env_id):
      return self.tickets.pop() if self.tickets else None

    async def put(self, trajectory):
      self.done.append(trajectory)

    async def report_error(self, ticket, error):
      raise AssertionError(error)

    async def fail(self, error):
      raise AssertionError(error)

  async def go():
    link = Link()
    worker = EnvWorker(config, "train_env_manager", [0, 1], link, [serve.grpc])
    endpoints = {id(m.endpoint) for m in worker.managers}
    assert len(endpoints) == 1 and worker.managers[0].endpoint is not None
    await worker.start()
    while len(link.done) < 2:
      await worker.status()  # raises what an env loop raised
      await asyncio.sleep(0.05)
    await worker.managers[0].endpoint.stop()
    await worker.client.close()
    return link.done

  done = asyncio.run(go())
  assert sorted(t.ticket.generation for t in done) == [0, 1]
  assert all(t.samples and t.samples[0].response_mask.count(1) > 0 for t in done)
