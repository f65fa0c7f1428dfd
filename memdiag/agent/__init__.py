"""The per-rank side of memdiag: hooks, samplers and the records they write."""
