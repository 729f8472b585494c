"""What a learning experiment's lake holds: HALO's own (``halo_train.experiment.state``), under its old bench name."""

from halo_train.experiment.state import BASE_MODEL, LakeState  # noqa: F401
