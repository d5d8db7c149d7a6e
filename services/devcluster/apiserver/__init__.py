"""A Kubernetes API server test double: resource.k8s.io/v1 and the core v1 objects DRA needs.

    from services.devcluster.apiserver import ApiServer

    async with ApiServer(state_dir) as api:
        ...  # api.url, api.kubeconfig_path

As its own process: ``python -m services.devcluster.apiserver --state-dir DIR``.
"""

from .schema import DEFAULT_SCHEMA_VERSION
from .server import KUBE_VERSION, ApiServer

__all__ = ["DEFAULT_SCHEMA_VERSION", "KUBE_VERSION", "ApiServer"]
