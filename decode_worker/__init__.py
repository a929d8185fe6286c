"""Decode instances (TetriInfer §3.4): receive prefilled requests and their KV, decode with continuous batching."""
