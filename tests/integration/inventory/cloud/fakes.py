"""Local metadata servers that answer the way each cloud's real service does:
paths, required headers, token dances, status codes and JSON shapes taken from
the clouds' documentation and dranet's tests. They run on 127.0.0.1 (or a Unix
socket) inside the test's event loop and record every request.

Knobs: ``delay`` (seconds before every answer: a slow or hanging server),
``fail_next`` (answer that many requests with 503 first), ``healthy`` (False:
answer everything with 503), ``broken`` (path -> status to answer it with).
"""

from __future__ import annotations

import asyncio
import copy
import ipaddress
import json
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes


@dataclass
class FakeServer:
    """An aiohttp server with a catch-all router; subclasses implement ``answer``."""

    delay: float = 0.0
    fail_next: int = 0
    healthy: bool = True
    broken: dict[str, int] = field(default_factory=dict)
    requests: list[Seen] = field(default_factory=list)
    url: str = ""
    _runner: web.AppRunner | None = None

    async def answer(self, request: web.Request) -> web.StreamResponse:
        raise NotImplementedError

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.requests.append(
            Seen(request.method, request.path, dict(request.query), dict(request.headers), body)
        )
        if self.delay:
            await asyncio.sleep(self.delay)
        if not self.healthy:
            return web.Response(status=503, text="service unavailable")
        if request.path in self.broken:
            return web.Response(status=self.broken[request.path], text="broken on purpose")
        if self.fail_next > 0:
            self.fail_next -= 1
            return web.Response(status=503, text="warming up")
        return await self.answer(request)

    async def start(self, *, ssl_context: ssl.SSLContext | None = None, unix_path: str = "") -> str:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        if unix_path:
            site: web.BaseSite = web.UnixSite(self._runner, unix_path)
            await site.start()
            self.url = f"unix://{unix_path}"
            return self.url
        tcp = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=ssl_context)
        await tcp.start()
        server = tcp._server
        assert server is not None
        port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"{'https' if ssl_context else 'http'}://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def paths(self, method: str = "GET") -> list[str]:
        return [r.path for r in self.requests if r.method == method]


def _json(obj: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, text=json.dumps(obj), content_type="application/json")


# --- GCE -----------------------------------------------------------------------------

# instance/network-interfaces/?recursive=true as a real a3 VM answered it (dranet's
# gce.go keeps this capture), the first NIC with an alias range, plus an IPv6 NIC.
GCE_NICS: list[dict[str, Any]] = [
    {
        "accessConfigs": [{"externalIp": "35.225.164.134", "type": "ONE_TO_ONE_NAT"}],
        "dnsServers": ["169.254.169.254"],
        "forwardedIps": [],
        "gateway": "10.128.0.1",
        "ip": "10.128.0.70",
        "ipAliases": ["10.24.3.0/24"],
        "mac": "42:01:0a:80:00:46",
        "mtu": 1460,
        "network": "projects/628944397724/networks/default",
        "subnetmask": "255.255.240.0",
        "targetInstanceIps": [],
    },
    {
        "accessConfigs": [{"externalIp": "", "type": "ONE_TO_ONE_NAT"}],
        "dnsServers": ["169.254.169.254"],
        "forwardedIps": [],
        "gateway": "192.168.1.1",
        "ip": "192.168.1.2",
        "ipAliases": [],
        "mac": "42:01:c0:a8:01:02",
        "mtu": 8244,
        "network": "projects/628944397724/networks/aojea-dra-net-1",
        "subnetmask": "255.255.255.0",
        "targetInstanceIps": [],
    },
    {
        "accessConfigs": [],
        "dnsServers": ["169.254.169.254"],
        "forwardedIps": [],
        "gateway": "192.168.2.1",
        "gatewayIpv6": "fe80::1",
        "ip": "192.168.2.2",
        "ipAliases": [],
        "ipv6": ["2600:1900:4000:318:0:6:0:0/96"],
        "mac": "42:01:c0:a8:02:02",
        "mtu": 8896,
        "network": "projects/628944397724/networks/hpc-vpc",
        "nicType": "MRDMA",
        "subnetmask": "255.255.255.0",
        "targetInstanceIps": [],
    },
]


@dataclass
class GceMetadata(FakeServer):
    name: str = "gke-a3-node-1"
    machine_type: str = "projects/628944397724/machineTypes/a3-highgpu-8g"
    physical_host: str | None = "/CCCCCCC/BBBBBB/AAAA"
    nics: list[dict[str, Any]] = field(default_factory=lambda: copy.deepcopy(GCE_NICS))

    async def answer(self, request: web.Request) -> web.StreamResponse:
        flavor = {"Metadata-Flavor": "Google"}
        if request.path == "/":
            return web.Response(text="computeMetadata/\n", headers=flavor)
        if request.headers.get("Metadata-Flavor") != "Google":
            # The real server refuses requests without the header (SSRF protection).
            return web.Response(status=403, text="Missing Metadata-Flavor:Google header.", headers=flavor)
        tail = request.path.removeprefix("/computeMetadata/v1/")
        if tail == "instance/name":
            return web.Response(text=self.name, headers=flavor)
        if tail == "instance/machine-type":
            return web.Response(text=self.machine_type, headers=flavor)
        if tail == "instance/network-interfaces/" and request.query.get("recursive") == "true":
            return web.Response(text=json.dumps(self.nics), content_type="application/json", headers=flavor)
        if tail == "instance/attributes/physical_host" and self.physical_host is not None:
            return web.Response(text=self.physical_host, headers=flavor)
        return web.Response(status=404, text="Not Found", headers=flavor)


# --- AWS -----------------------------------------------------------------------------


@dataclass
class AwsImds(FakeServer):
    """IMDSv2: PUT /latest/api/token, then GETs carrying X-aws-ec2-metadata-token."""

    instance_type: str = "trn1.32xlarge"
    region: str = "us-west-2"
    tokens: set[str] = field(default_factory=set)
    # IMDSv1-only instances refuse the token PUT; the SDK then goes on without one.
    imdsv1_only: bool = False

    def expire_tokens(self) -> None:
        self.tokens.clear()

    async def answer(self, request: web.Request) -> web.StreamResponse:
        if request.path == "/latest/api/token":
            if request.method != "PUT":
                return web.Response(status=405)
            if self.imdsv1_only:
                return web.Response(status=403, text="Forbidden")
            ttl = request.headers.get("X-aws-ec2-metadata-token-ttl-seconds", "")
            if not ttl.isdigit() or not 1 <= int(ttl) <= 21600:
                return web.Response(status=400, text="Missing or invalid TTL")
            token = f"AQAEAtoken{len(self.tokens)}=="
            self.tokens.add(token)
            return web.Response(text=token, headers={"X-aws-ec2-metadata-token-ttl-seconds": ttl})
        if not self.imdsv1_only and request.headers.get("X-aws-ec2-metadata-token") not in self.tokens:
            return web.Response(status=401, text="Unauthorized")
        if request.path == "/latest/dynamic/instance-identity/document":
            return _json(
                {
                    "accountId": "123456789012",
                    "architecture": "x86_64",
                    "availabilityZone": f"{self.region}b",
                    "billingProducts": None,
                    "devpayProductCodes": None,
                    "marketplaceProductCodes": None,
                    "imageId": "ami-0b69ea66ff7391e80",
                    "instanceId": "i-0c3f1f29a8b3e6d4a",
                    "instanceType": self.instance_type,
                    "kernelId": None,
                    "pendingTime": "2026-09-01T10:00:00Z",
                    "privateIp": "10.0.32.5",
                    "ramdiskId": None,
                    "region": self.region,
                    "version": "2017-09-30",
                }
            )
        if request.path == "/latest/meta-data/instance-type":
            return web.Response(text=self.instance_type)
        return web.Response(status=404, text="Not Found")


# --- Azure ---------------------------------------------------------------------------

AZURE_COMPUTE: dict[str, Any] = {
    "azEnvironment": "AzurePublicCloud",
    "location": "southcentralus",
    "name": "aks-gpu-12345678-vmss000000",
    "osType": "Linux",
    "placementGroupId": "739e6cfb-2607-462e-9e2b-21d24b31f5ed",
    "interconnectGroupId": "2deed8b4-d1e9-42be-a40a-9882201aa9f5",
    "interconnectSubgroupId": "0f0ba375-aaf1-4ac8-a579-a3b180d47de5",
    "platformFaultDomain": "0",
    "platformUpdateDomain": "0",
    "provider": "Microsoft.Compute",
    "resourceGroupName": "MC_rg_aks_southcentralus",
    "vmId": "02aab8a4-74ef-476e-8182-f6d2ba4166a6",
    "vmScaleSetName": "aks-gpu-12345678-vmss",
    "vmSize": "Standard_ND128isr_GB300_v6",
    "zone": "1",
}
AZURE_NETWORK: dict[str, Any] = {
    "interface": [
        {
            "ipv4": {
                "ipAddress": [{"privateIpAddress": "10.224.0.4", "publicIpAddress": ""}],
                "subnet": [{"address": "10.224.0.0", "prefix": "16"}],
            },
            "ipv6": {"ipAddress": []},
            "macAddress": "6045BDA7A2B1",
        },
        {
            "ipv4": {
                "ipAddress": [{"privateIpAddress": "10.144.133.132", "publicIpAddress": ""}],
                "subnet": [{"address": "10.144.133.128", "prefix": "26"}],
            },
            "ipv6": {"ipAddress": [{"privateIpAddress": "fda0:ad0a:cdcb:2000::5"}]},
            "macAddress": "000D3AF806EC",
        },
    ]
}


@dataclass
class AzureImds(FakeServer):
    compute: dict[str, Any] = field(default_factory=lambda: copy.deepcopy(AZURE_COMPUTE))
    network: dict[str, Any] = field(default_factory=lambda: copy.deepcopy(AZURE_NETWORK))

    async def answer(self, request: web.Request) -> web.StreamResponse:
        if request.headers.get("Metadata") != "true":
            return _json({"error": "Bad request. Required metadata header not specified"}, 400)
        if "api-version" not in request.query:
            return _json(
                {
                    "error": "Bad request. api-version was not specified in the request",
                    "newest-versions": ["2025-11-11"],
                },
                400,
            )
        if request.path == "/metadata/instance":
            if request.query.get("format") == "text":
                return web.Response(text="compute/\nnetwork/")
            return _json({"compute": self.compute, "network": self.network})
        if request.path == "/metadata/instance/compute":
            return _json(self.compute)
        if request.path == "/metadata/instance/network":
            return _json(self.network)
        return _json({"error": "Not found"}, 404)


# --- OCI / OKE -----------------------------------------------------------------------

OKE_INSTANCE: dict[str, Any] = {
    "availabilityDomain": "TrcQ:US-ASHBURN-AD-2",
    "faultDomain": "FAULT-DOMAIN-1",
    "compartmentId": "ocid1.compartment.oc1..aaaaaaaaexamplecompartment",
    "displayName": "oke-gpu-node-1",
    "hostname": "oke-gpu-node-1",
    "id": "ocid1.instance.oc1.iad.anuwcljtexampleinstance",
    "image": "ocid1.image.oc1.iad.aaaaaaaaexampleimage",
    "region": "iad",
    "canonicalRegionName": "us-ashburn-1",
    "ociAdName": "iad-ad-2",
    "shape": "BM.GPU.GB200-v3.4",
    "state": "Running",
    "timeCreated": 1751000000000,
    "agentConfig": {"monitoringDisabled": False, "managementDisabled": False, "allPluginsDisabled": False},
}
_OCID = "aaaaaaaa2mvjha24vj6evyafdqtis6nzqibhrnxxhzt65zkc3upy4xlrz5za"
OKE_HOST: dict[str, Any] = {
    "id": "ocid1.computebaremetalhost.oc1.iad.anuwcljtexamplehost",
    "networkBlockId": "fallback-network-block",
    "rackId": "c1d2e3f4a5b6",
    "buildingId": "building-1",
    "rdmaTopologyData": {
        "customerGpuMemoryFabric": f"ocid1.computegpumemoryfabric.oc1.iad.{_OCID}",
        "customerHPCIslandId": f"ocid1.hpcisland.oc1.iad.{_OCID}",
        "customerHostId": f"ocid1.computebaremetalhost.oc1.iad.{_OCID}",
        "customerLocalBlock": f"ocid1.computelocalblock.oc1.iad.{_OCID}",
        "customerNetworkBlock": f"ocid1.computenetworkblock.oc1.iad.{_OCID}",
    },
    "rdmaFabricData": {"ipv6": False, "planes": 4},
}
OKE_VNICS: list[dict[str, Any]] = [
    {
        "vnicId": "ocid1.vnic.oc1.iad.abuwcljtexampleprimary",
        "privateIp": "10.0.0.25",
        "vlanTag": 0,
        "macAddr": "02:00:17:01:9c:22",
        "virtualRouterIp": "10.0.0.1",
        "subnetCidrBlock": "10.0.0.0/16",
        "nicIndex": 0,
    },
    {
        "vnicId": "ocid1.vnic.oc1.iad.abuwcljtexamplesecondary",
        "privateIp": "10.0.1.233",
        "vlanTag": 1,
        "macAddr": "02:00:17:04:1a:57",
        "virtualRouterIp": "10.0.0.1",
        "subnetCidrBlock": "10.0.0.0/16",
        "nicIndex": 1,
    },
]


@dataclass
class OciImds(FakeServer):
    instance: dict[str, Any] = field(default_factory=lambda: copy.deepcopy(OKE_INSTANCE))
    host: dict[str, Any] = field(default_factory=lambda: copy.deepcopy(OKE_HOST))
    vnics: list[dict[str, Any]] = field(default_factory=lambda: copy.deepcopy(OKE_VNICS))

    async def answer(self, request: web.Request) -> web.StreamResponse:
        if request.headers.get("Authorization") != "Bearer Oracle":
            return _json(
                {
                    "code": "NotAuthenticated",
                    "message": "Authorization failed or requested resource not found",
                },
                401,
            )
        routes = {
            "/opc/v2/instance/": self.instance,
            "/opc/v2/host/": self.host,
            "/opc/v2/vnics/": self.vnics,
        }
        if request.path in routes:
            return _json(routes[request.path])
        return _json({"code": "NotFound", "message": "Not Found"}, 404)


def oke_parent_address(index: int, vnic_ip: str = "10.0.0.25", subnet: str = "10.0.0.0/16") -> str:
    """The address OCA classic mode gives rdma<index> (for building the test host)."""
    net = ipaddress.ip_network(subnet)
    offset = index * net.num_addresses + int(ipaddress.ip_address(vnic_ip)) - int(net.network_address)
    return str(ipaddress.ip_address(int(ipaddress.ip_address("10.224.0.0")) + offset))


# --- Alibaba -------------------------------------------------------------------------


@dataclass
class AlibabaMetadata(FakeServer):
    instance_type: str = "ecs.gn8is-2x.8xlarge"
    tokens: set[str] = field(default_factory=set)

    async def answer(self, request: web.Request) -> web.StreamResponse:
        if request.path == "/latest/api/token":
            if request.method != "PUT":
                return web.Response(status=405)
            ttl = request.headers.get("X-aliyun-ecs-metadata-token-ttl-seconds", "")
            if not ttl.isdigit() or not 1 <= int(ttl) <= 21600:
                return web.Response(status=400, text="invalid token ttl")
            token = f"AAAAAtoken{len(self.tokens)}"
            self.tokens.add(token)
            return web.Response(text=token)
        if request.headers.get("X-aliyun-ecs-metadata-token") not in self.tokens:
            return web.Response(status=401, text="Unauthorized")
        if request.path == "/latest/meta-data/instance-id":
            return web.Response(text="i-bp1hygp5b04o5aqxrcqq")
        if request.path == "/latest/meta-data/instance/instance-type":
            return web.Response(text=self.instance_type)
        return web.Response(status=404, text="Not Found")


# --- CoreWeave CKS (a Kubernetes API server answering GET Node) ----------------------

CKS_LABELS = {
    "cks.coreweave.com/cluster": "use15",
    "backend.coreweave.cloud/flavor": "infiniband",
    "backend.coreweave.cloud/fabric": "US-EAST-15A-FAB66",
    "backend.coreweave.cloud/superpod": "2",
    "backend.coreweave.cloud/leafgroup": "856886992745",
    "backend.coreweave.cloud/leafgroup-name": "90.1-DH1",
    "node.coreweave.cloud/rack": "82",
    "backend.coreweave.cloud/speed.current": "3200G",
    "backend.coreweave.cloud/speed.expected": "3200G",
    "node.kubernetes.io/instance-type": "b200-8x",
    "backend.coreweave.cloud/neighbors.expected.ibp0.device": "L90.1.3",
    "kubernetes.io/hostname": "g1234",
}


@dataclass
class KubeApi(FakeServer):
    nodes: dict[str, dict[str, str]] = field(default_factory=dict)

    async def answer(self, request: web.Request) -> web.StreamResponse:
        prefix = "/api/v1/nodes/"
        if request.method == "GET" and request.path.startswith(prefix):
            name = request.path[len(prefix) :]
            labels = self.nodes.get(name)
            if labels is None:
                return _json(
                    {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "metadata": {},
                        "status": "Failure",
                        "message": f'nodes "{name}" not found',
                        "reason": "NotFound",
                        "details": {"name": name, "kind": "nodes"},
                        "code": 404,
                    },
                    404,
                )
            return _json(
                {
                    "kind": "Node",
                    "apiVersion": "v1",
                    "metadata": {
                        "name": name,
                        "uid": "5b1c4c66-8f53-4d5e-9a3b-0c4c2f0d9e11",
                        "resourceVersion": "123456",
                        "creationTimestamp": "2026-09-01T10:00:00Z",
                        "labels": labels,
                    },
                    "spec": {"podCIDR": "10.0.5.0/24"},
                    "status": {
                        "conditions": [],
                        "addresses": [{"type": "InternalIP", "address": "10.0.0.5"}],
                    },
                }
            )
        return _json(
            {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404, "reason": "NotFound"},
            404,
        )


# --- Webhook (a whereabouts-like IPAM keyed by claim UID) ----------------------------


@dataclass
class Webhook(FakeServer):
    cloud_provider: bool = True
    profile_provider: bool = True
    pool: str = "10.200.200.0/24"
    profiles: tuple[str, ...] = ("python-profile",)
    # Set to force an answer: (status, body) for the profile endpoints.
    forced: tuple[int, str] | None = None
    health_body: str | None = None
    leases: dict[str, str] = field(default_factory=dict)

    async def answer(self, request: web.Request) -> web.StreamResponse:
        if request.path == "/health" and request.method == "GET":
            if self.health_body is not None:
                return web.Response(text=self.health_body, content_type="application/json")
            return _json({"cloudProvider": self.cloud_provider, "profileProvider": self.profile_provider})
        if request.method != "POST":
            return web.Response(status=404)
        try:
            req = json.loads(await request.read())
        except ValueError:
            return web.Response(status=400, text="bad JSON")
        if request.path == "/GetDeviceAttributes":
            if req.get("name") == "dummy1":
                return _json(
                    {
                        "dra.net/webhook_attr": {"string": "python"},
                        "example.com/rail": {"int": 3},
                        "example.com/fast": {"bool": True},
                        "example.com/fw": {"version": "1.2.3"},
                        "Bad Name/x": {"string": "dropped"},
                        "example.com/toolong": {"string": "x" * 65},
                    }
                )
            return _json({})
        if request.path == "/GetDeviceConfig":
            return _json({"interface": {"mtu": 1450}} if req.get("name") == "dummy1" else {})
        if request.path in ("/GetProfileConfig", "/ReleaseProfileConfig") and self.forced is not None:
            status, body = self.forced
            return web.Response(status=status, text=body)
        if request.path == "/GetProfileConfig":
            profile = (req.get("config") or {}).get("profile")
            if profile not in self.profiles:
                return web.Response(status=404, text=f'CNI profile "{profile}" not found')
            claim = req["claim_uid"]
            if claim not in self.leases:
                used = set(self.leases.values())
                net = ipaddress.ip_network(self.pool)
                free = next(str(h) for h in net.hosts() if str(h) not in used)
                self.leases[claim] = free
            addr = self.leases[claim]
            return _json(
                {
                    "interface": {"addresses": [f"{addr}/{ipaddress.ip_network(self.pool).prefixlen}"]},
                    "routes": [{"destination": "10.201.0.0/16", "gateway": "10.200.200.1"}],
                }
            )
        if request.path == "/ReleaseProfileConfig":
            self.leases.pop(req.get("claim_uid", ""), None)
            return web.Response(status=200)
        return web.Response(status=404)
