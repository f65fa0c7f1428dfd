"""A job in which one rank, the last, receives far more than the others: every rank sends it
``--rows`` rows of 1024 floats through one ``hvd.alltoall`` and one row to each other rank. Under a
memory limit between the two, only the last rank passes it, and it does so inside the alltoall.

    memdiag run tests/hosts/alltoall_to_one_rank.py -n 4 --mem-limit 1.1G -- --rows 65536
"""

import argparse

import horovod.tensorflow as hvd
import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--rows", type=int, default=65536)
args = parser.parse_args()

hvd.init()
heavy = hvd.size() - 1
splits = [args.rows if rank == heavy else 1 for rank in range(hvd.size())]
rows = tf.ones([sum(splits), 1024])
hvd.allreduce(tf.ones([4]), name="warm_up")
received, _ = hvd.alltoall(rows, splits=splits, name="rows_to_the_last_rank")
print(f"rank {hvd.rank()} received {received.shape[0]} rows")
