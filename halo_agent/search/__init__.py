"""Monte Carlo Tree Search over browser tasks, Agent Q style; trees into the lake's ``mcts_nodes``.

    from halo_agent.search import SearchConfig, run_search

    summary = run_search(SearchConfig(env="miniwob", tasks=["click-button-sequence"], policy="random",
                                      simulations=32, expansions=4, c_exp=1.0, alpha=0.5, max_depth=4,
                                      critic="progress", lake="lake"))

``tree`` holds the tree and UCB1, ``critics`` the critics (``progress``, ``policy``, a
model), ``mcts`` the search itself (restore through ``halo_agent.restore``), ``run``
the run into the lake. ``halo-agent search`` is the command line.
"""

from halo_agent.search.config import SearchConfig, SearchError
from halo_agent.search.critics import CriticError
from halo_agent.search.run import SearchSummary, run_search

__all__ = ["CriticError", "SearchConfig", "SearchError", "SearchSummary", "run_search"]
