"""phalanx's version, in a module of its own: the engine-side version check reads it without
importing the package (which imports everything the check is part of)."""

__version__ = "0.3.0"
