"""Serve a local REAL clone: ``python -m halo_agent.sites gomail [--port 8377]`` (omnizon: 8378, gocalendar: 8379)."""

from __future__ import annotations

import argparse
import logging
import sys

from halo_agent.local_http import serve_until_interrupted
from halo_agent.sites import DEFAULT_PORTS, SITES, LocalSite, UnknownSiteError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m halo_agent.sites", description=__doc__)
    parser.add_argument("site", choices=SITES)
    parser.add_argument("--port", type=int, default=None,
                        help="port on 127.0.0.1 (default: the site's own, " + ", ".join(f"{s} {p}" for s, p in DEFAULT_PORTS.items())
                        + ", which its tasks point at; 0 = any free port)")
    args = parser.parse_args(argv)
    if args.port is None:
        args.port = DEFAULT_PORTS[args.site]
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    return serve_until_interrupted(
        lambda: LocalSite(args.site, port=args.port), (UnknownSiteError, OSError),
        lambda site: f"Serving {args.site} at {site.url} (Ctrl-C to stop)",
    )


if __name__ == "__main__":
    sys.exit(main())
