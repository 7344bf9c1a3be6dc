"""actor_infer: a JetStream server for rollx models, live weight updates, a rollout client.

Only this package imports jetstream.
"""

# gRPC metadata the rollx server and client agree on (JetStream's Decode messages
# have no fields for them).
SAMPLING_KEY = "rollx-sampling"  # request: "train" | "val"
# request, optional: "temperature,top_p" overriding the mode's (the OpenAI endpoint's
# per-request sampling outside training; top_k stays the mode's)
SAMPLING_PARAMS_KEY = "rollx-sampling-params"
REQUEST_ID_KEY = "rollx-request-id"  # request: for logs
# request: the conversation it continues (the server reuses its cached keys/values when
# the ids start with the previous turn's prompt and response)
TRAJECTORY_KEY = "rollx-trajectory-id"
VERSIONS_KEY = "rollx-policy-versions"  # trailing: one weights version per token
PREFILL_VERSION_KEY = "rollx-prefill-version"  # trailing: version that prefilled the prompt
# trailing, binary (gRPC's -bin suffix): float32 little-endian, one behaviour log-prob per
# token, bit-exact (text would round them)
BEHAVIOUR_LOGP_KEY = "rollx-behaviour-logp-bin"

# rollx's one RPC beside JetStream's service: the trajectory (utf-8 bytes) ended, its cached
# keys/values may go (raw bytes both ways: no proto needed)
END_TRAJECTORY_METHOD = "/rollx.Rollout/EndTrajectory"

# Prompt lengths a server pads to (JetStream's padding buckets): powers of two.
PREFILL_BUCKETS = tuple(2**i for i in range(4, 16))
