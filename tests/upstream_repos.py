"""Where the tests that compare with upstream code find its git repositories: FLUX_GRPO_UPSTREAM_DIR
holds one folder per repository, named ``<owner>+<name>`` with its git directory in ``repo``
(what a bare ``git clone --mirror`` of github.com/<owner>/<name> into ``<owner>+<name>/repo`` gives).
Unset or missing: those comparisons skip and say so."""

from __future__ import annotations

import os
from pathlib import Path


def upstream_repo(full_name: str) -> Path:
    """The git directory of ``owner/name`` under FLUX_GRPO_UPSTREAM_DIR (it may not exist)."""
    root = os.environ.get("FLUX_GRPO_UPSTREAM_DIR", "")
    return Path(root) / full_name.replace("/", "+") / "repo" if root else Path("/nonexistent-upstream") / full_name
