"""Control plane: front doors, GlobalScheduler, ClusterMonitor, launcher and CLI (TetriInfer §3.2)."""
