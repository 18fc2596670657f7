"""The package's version, one home: the root re-exports it and the Lab panel reports it."""

__version__ = "0.1.0"
