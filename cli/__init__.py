"""The ``cacheflow`` command line (click); entry point ``cli.main:main``."""
