"""Fault-injection suite (FAULTS.md): real servers, real processes, real kills."""
