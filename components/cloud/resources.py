"""`CloudSettings`: the labels, customer-managed key and network every Google Cloud resource a
run creates is given, one definition from the command line (`--label`, `--kms-key`,
`--network`) to each step's create calls.

It travels into the compiled pipeline as one JSON string (`to_json`), a compile-time input of
each step that creates something on Google Cloud, and into the run itself (submit/schedule).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field

from components.cloud.labels import label_problems, merged_labels

_KMS_KEY = re.compile(r"projects/[^/]+/locations/[^/]+/keyRings/[^/]+/cryptoKeys/[^/]+")
_NETWORK = re.compile(r"projects/[^/]+/global/networks/[^/]+")
KMS_KEY_FORM = "projects/P/locations/L/keyRings/R/cryptoKeys/K"
NETWORK_FORM = "projects/PROJECT_NUMBER/global/networks/NAME"


@dataclass(frozen=True)
class CloudSettings:
    labels: dict[str, str] = field(default_factory=dict)  # the user's; the run's and detpipe's are added
    kms_key: str = ""  # a Cloud KMS key that encrypts what is created; empty: Google-managed
    network: str = ""  # a VPC network runs and custom jobs are peered with; empty: none

    def __post_init__(self):
        found = label_problems(self.labels)
        if self.kms_key and not _KMS_KEY.fullmatch(self.kms_key):
            found.append(f"--kms-key must be {KMS_KEY_FORM}, got {self.kms_key!r}")
        if self.network and not _NETWORK.fullmatch(self.network):
            found.append(f"--network must be {NETWORK_FORM}, got {self.network!r}")
        if found:
            raise ValueError("\n".join(found))

    def resource_labels(self, own: dict[str, str] | None = None, environ: dict[str, str] | None = None
                        ) -> dict[str, str]:
        """The labels of one resource: the run's, the user's, detpipe's and `own`."""
        return merged_labels(self.labels, own, environ)

    def encryption_spec(self):
        """The key as the API's EncryptionSpec message (aiplatform_v1), or None without one."""
        if not self.kms_key:
            return None
        from google.cloud.aiplatform_v1.types import EncryptionSpec

        return EncryptionSpec(kms_key_name=self.kms_key)

    def to_json(self) -> str:
        """The step input: sorted, so the compiled YAML is byte-identical.

        >>> CloudSettings({"team": "vision"}).to_json()
        '{"kms_key": "", "labels": {"team": "vision"}, "network": ""}'
        """
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "CloudSettings":
        return cls(**json.loads(text)) if text else cls()
