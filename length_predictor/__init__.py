"""Output-length prediction (TetriInfer §3.3.2). The trained classifier arrives with its own issue;
``baseline`` is the honest fallback used until then."""
