"""The package version, alone in a module: the package, its checkpoints and ``setup.py`` read it from here
without importing each other (or torch)."""
__version__ = "0.5.0"
