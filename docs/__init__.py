"""The docs' worked examples as data: ``python -m docs.regenerate`` (see docs/README.md)."""
