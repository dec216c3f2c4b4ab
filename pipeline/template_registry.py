"""Upload the compiled pipeline to an Artifact Registry KFP repository, so that
"Create run → select from Artifact Registry" in the Vertex console runs it with
editable parameters. Uses `kfp.registry.RegistryClient` as is."""

from __future__ import annotations

import re

REPO_PATTERN = re.compile(r"^https://[a-z0-9-]+-kfp\.pkg\.dev/[^/]+/[^/]+/?$")


def upload_template(repo: str, template_yaml: str, tags: list[str], auth=None) -> tuple[str, str]:
    """Upload `template_yaml` with `tags`; returns (package name, version) as the registry reports them.

    `auth`: google.auth credentials; None uses the application default credentials.
    """
    from kfp.registry import RegistryClient

    if not REPO_PATTERN.match(repo):
        raise ValueError(f"--repo must look like https://REGION-kfp.pkg.dev/PROJECT/REPO, got {repo!r}")
    if not tags:
        raise ValueError("give at least one --tag (e.g. v1, latest)")
    if auth is None:
        import google.auth

        auth, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
    client = RegistryClient(host=repo.rstrip("/"), auth=auth)
    return client.upload_pipeline(file_name=template_yaml, tags=list(tags))
