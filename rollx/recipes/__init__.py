"""How models are built: the default model (make_default), its warm start, scripted policies."""
