"""Run specs, the durable run queue and the checkpoint store layout. No torch, no FastAPI."""
