#!/usr/bin/env python3
"""Nightly step "Find the previous night": the run id of the last successful nightly-trn2 run,
as the step output ``run-id`` (empty when there is none), for actions/download-artifact.

    GH_TOKEN=... python3 scripts/nightly/baseline_run.py >> "$GITHUB_OUTPUT"

The DLAMI has no GitHub CLI, so this asks GitHub's REST API directly (standard library only):
``GET $GITHUB_API_URL/repos/$GITHUB_REPOSITORY/actions/workflows/nightly-trn2.yml/runs
?status=success&per_page=1`` with the job's token (``permissions: actions: read``). No previous
night, no token or no answer: no baseline tonight, never a failure (a notice says why).
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request

WORKFLOW = "nightly-trn2.yml"


def previous_run(api: str, repository: str, token: str) -> tuple[str, str]:
    """(run id or "", why)."""
    url = f"{api}/repos/{repository}/actions/workflows/{WORKFLOW}/runs?status=success&per_page=1"
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}",
                                                   "Accept": "application/vnd.github+json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            runs = json.load(response).get("workflow_runs") or []
    except (urllib.error.URLError, OSError, ValueError) as error:
        return "", f"{url}: {error}"
    if not runs:
        return "", "no previous successful night"
    return str(runs[0]["id"]), f"night run {runs[0]['id']}"


def main() -> int:
    api = os.environ.get("GITHUB_API_URL") or "https://api.github.com"
    repository, token = os.environ.get("GITHUB_REPOSITORY"), os.environ.get("GH_TOKEN")
    if not repository or not token:
        run_id, why = "", "no GITHUB_REPOSITORY or GH_TOKEN"
    else:
        run_id, why = previous_run(api, repository, token)
    print(f"::notice::baseline: {why}", file=sys.stderr)
    print(f"run-id={run_id}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
