"""Prefill instances (TetriInfer §3.3): local queue, length predictor, chunked prefill engine, dispatcher."""
