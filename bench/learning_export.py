"""A learning experiment's results as data: HALO's own export (``halo_train.experiment.export``), under its old
bench name."""

from halo_train.experiment.export import (  # noqa: F401
    ADAPTER_FILES, EPISODE_COLUMNS, OFFLINE_SIGNALS, ONLINE_SIGNALS, SIGNAL_WINDOW, copy_adapter, episode_rows,
    evidence, export, offline_training, state_novelty, timing, training_env_steps, training_runs,
)
