"""``python -m cli`` runs the cacheflow command."""

from cli.main import main

main()
