"""The training engine: optimizer and schedule, the step, checkpoints, and the trainer loop."""
