"""The ``fastmace`` command line."""
