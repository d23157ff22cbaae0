"""A stub of a module transformers' source distribution does not ship (see ../__init__.py)."""
