"""Implementations: pure, importable, no CLI and no file I/O. Never import suites or reports."""
