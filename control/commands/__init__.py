"""Subcommands of ``specctl``; each module has ``register(subparsers)``."""
