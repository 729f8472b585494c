"""A learning experiment's protocol: HALO's own (``halo_train.experiment.protocol``), under its old bench name."""

from halo_train.experiment.protocol import (  # noqa: F401
    ARM_KINDS, SPLITS, TEST_SPLITS, EvalCell, Protocol, ProtocolError, load,
)
