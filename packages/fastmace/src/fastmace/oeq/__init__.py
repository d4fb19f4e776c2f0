"""The hybrid backend's runtime: OpenEquivariance's host extension, prebuilt or built once.

Importing this package imports neither torch nor OpenEquivariance.
"""
