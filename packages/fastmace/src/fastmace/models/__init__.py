"""Models: the label table, checkpoint files, loading, backend conversion, templates.

Importing this package imports neither torch nor MACE; the modules that need them do so
themselves.
"""
