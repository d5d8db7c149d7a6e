"""A Kubernetes API server test double: resource.k8s.io/v1 and the core v1 objects DRA needs.

    from services.devcluster.apiserver import ApiServer

    async with ApiServer(state_dir) as api:
        ...  # api.url (http://127.0.0.1:PORT), api.kubeconfig_path (state_dir/kubeconfig)

As its own process: ``python -m services.devcluster.apiserver --state-dir DIR [--port N]
[--state-file F]`` prints ``{"url": ..., "kubeconfig": ...}`` when it answers.

Served: resourceslices, deviceclasses, resourceclaims (+status), resourceclaimtemplates;
pods (+status, +binding), bindings, nodes (+status), namespaces (+status, +finalize),
events. It claims to be Kubernetes v1.34 and validates against the 1.34 OpenAPI schema
shipped by kubernetes-validate plus the apiserver's own DRA rules (validation.py).

Where it knowingly differs from a real kube-apiserver:

* ``fieldValidation`` defaults to Strict (unknown fields refused); the real default is Warn.
  ``ApiServer(default_field_validation="Warn")`` restores it.
* JSON only: protobuf request bodies (kubectl's typed clients: ``create namespace``,
  ``run``) get 415. No aggregated discovery (clients fall back to the legacy documents),
  no OpenAPI v2, no authentication or authorization, no admission webhooks.
* Feature gates are not modelled: every field of the 1.34 schema is accepted, alpha ones too.
* Quantities are stored as sent (numbers become strings) instead of canonicalized.
* Pod validation covers what the dev cluster writes (containers, claims, immutability of the
  spec), not all of it; no service-account token volume is injected.
* Server-side apply: see fieldmanager.py for the modelled subset.
"""

from .schema import DEFAULT_SCHEMA_VERSION
from .server import KUBE_VERSION, ApiServer

__all__ = ["DEFAULT_SCHEMA_VERSION", "KUBE_VERSION", "ApiServer"]
