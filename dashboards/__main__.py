"""Start the dashboard: ``python -m dashboards --lake PATH [--port 8501] [--host 127.0.0.1]``.

``halo-data dashboard`` runs this module, so the lake's CLI never imports the screen.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

APP = Path(__file__).resolve().parent / "app.py"


def streamlit_command(lake: str | None, port: int, host: str) -> list[str]:
    return [
        sys.executable, "-m", "streamlit", "run", str(APP),
        "--server.port", str(port), "--server.address", host, "--server.headless", "true",
        "--browser.gatherUsageStats", "false",
        # An analyst's tool: no "Deploy" button, rerun or clear-cache menu (the sidebar has Refresh).
        "--client.toolbarMode", "viewer",
        "--", *(["--lake", lake] if lake else []),  # without --lake the app reads $HALO_LAKE, else lake/
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dashboards", description="HALO's dashboard over a lake.")
    parser.add_argument("--lake", default=None, help="Lake root (default: $HALO_LAKE, else lake/).")
    parser.add_argument("--port", type=int, default=8501)
    parser.add_argument("--host", default="127.0.0.1", help="Address to listen on.")
    args = parser.parse_args(argv)
    return subprocess.call(streamlit_command(args.lake, args.port, args.host))


if __name__ == "__main__":
    sys.exit(main())
