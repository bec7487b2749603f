"""Measuring: the benchmark ladder, claims, time-to-accuracy and the tuner."""
