"""actor_infer: a JetStream server for rollx models, live weight updates, a rollout client.

Only this package imports jetstream.
"""
