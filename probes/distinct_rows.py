"""Distinct ids U per rank and step in the built-in Transformer's source batches (memdiag's own Zipf
generator, the workload's seeding), against the tokens T: what `--mode dedup` gathers instead of T,
and the rank counts where the gathered bytes pass the dense table, merged and unmerged.

    .venv/bin/python probes/distinct_rows.py --vocab 33945 --tokens 5000 --width 1024 --ranks 8 --steps 4
"""

from __future__ import annotations

import argparse

import numpy as np

from memdiag.formula import crossover_ranks
from memdiag.workloads.data import ZipfTokens, batch_rng


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, required=True)
    parser.add_argument("--tokens", type=int, required=True, help="tokens per rank per step (T)")
    parser.add_argument("--seq-len", type=int, default=50)
    parser.add_argument("--exponent", type=float, default=1.1)
    parser.add_argument("--width", type=int, default=1024, help="embedding row width (float32)")
    parser.add_argument("--index-bytes", type=int, default=4)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    tokens = ZipfTokens(args.vocab, args.exponent)
    batch = max(1, args.tokens // args.seq_len)
    rows = batch * args.seq_len
    distinct = [len(np.unique(tokens.sample(batch_rng(args.seed, rank, step), (batch, args.seq_len))))
                for rank in range(args.ranks) for step in range(args.steps)]
    low, high = min(distinct), max(distinct)
    row_bytes = 4 * args.width
    print(f"vocabulary {args.vocab}, T = {rows} tokens per rank, Zipf exponent {args.exponent:g}, "
          f"{args.ranks} ranks x {args.steps} steps: U = {low}-{high} (U/T {low / rows:.2f}-{high / rows:.2f})")
    for label, n_rows in (("unmerged", rows), ("merged, U_max", high)):
        n = crossover_ranks(n_rows, row_bytes, args.index_bytes, args.vocab)
        print(f"  {label}: gathered bytes pass the dense table ({args.vocab} x {row_bytes} B) from N = {int(n) + 1} "
              f"(N* = {n:.1f})")


if __name__ == "__main__":
    main()
