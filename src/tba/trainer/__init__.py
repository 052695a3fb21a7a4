"""The trainer service: sample from the buffer, train with Trajectory Balance, publish weights."""
