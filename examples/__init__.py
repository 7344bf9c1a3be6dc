"""Agent programs trained with rollx through its OpenAI-compatible endpoint
(custom_envs.<tag>.agent_loop = "program", agent_program = "examples.<module>:<function>")."""
