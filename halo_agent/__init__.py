"""HALO browser agents: environments (MiniWoB++, REAL through agisdk), policies, rewards and rollouts (``halo_agent.rollout``)."""
