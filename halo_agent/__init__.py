"""HALO browser agents: environments (MiniWoB++, REAL through agisdk), policies, rewards and the rollout sampler."""
