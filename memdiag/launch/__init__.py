"""Starting N ranks under mpirun and supervising them."""
