"""Pre-registered experiments: a protocol file, its screening, its runner, its records and its results.

    halo-train experiment screen PROTOCOL.yaml      # candidate tasks on dev seeds (before registration)
    halo-train experiment register PROTOCOL.yaml    # the protocol's hash and the code's commit, recorded
    halo-train experiment run PROTOCOL.yaml         # every stage not yet done, at the registered commit
    halo-train experiment status PROTOCOL.yaml      # what is done, what is left
    halo-train experiment export PROTOCOL.yaml      # episodes.parquet, timing, evidence, meta, adapters
    halo-train experiment report PROTOCOL.yaml      # success per arm and split with its intervals
    halo-train experiment pack PROTOCOL.yaml --to DIR     # what `run` needs to go on elsewhere, copied to DIR
    halo-train experiment unpack PROTOCOL.yaml --from DIR # the root again, from a pack

See docs/learning.md.
"""

from halo_train.experiment.protocol import EvalCell, Protocol, ProtocolError, load
from halo_train.experiment.record import ExperimentError, Records
from halo_train.experiment.runner import Runner

__all__ = ["EvalCell", "ExperimentError", "Protocol", "ProtocolError", "Records", "Runner", "load"]
