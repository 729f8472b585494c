"""``python -m halo_train.experiment ...``: the same commands as ``halo-train experiment ...``."""

from halo_train.experiment.cli import experiment

if __name__ == "__main__":
    experiment(prog_name="halo-train experiment")
