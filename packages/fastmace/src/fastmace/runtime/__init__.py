"""Process-wide settings: environment variables, the cache, file locks and NFS.

Nothing in this package imports torch, MACE or any other module of fastmace.
"""
