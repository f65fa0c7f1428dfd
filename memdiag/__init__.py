"""memdiag: memory diagnostics for Horovod collectives."""

__version__ = "0.1.0"
