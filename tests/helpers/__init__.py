"""Helpers the tests share: servers that misbehave on purpose, the simulator's own timing,
the browser, the terminal, compose files, the reference tables, and what a test leaves behind."""
