"""Reporting: run folders, metrics files, environment facts, timers, telemetry and plots."""
