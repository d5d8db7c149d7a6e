"""Our NRI, ttrpc and google.rpc protos against the upstream wire facts.

The tables below were written from containerd/nri's pkg/api/api.proto (v0.6.1,
as containerd 1.7.16-1.7.25 vendors it, plus the fields later NRI
releases added that we use) and containerd/ttrpc's request.proto. They are
compared with the descriptors generated from our .proto files, so a renamed
package, a renumbered field or a changed type fails here, not on a node.
"""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor, FileDescriptor

from proto.google.rpc import status_pb2
from proto.nri.v1alpha1 import nri_pb2
from proto.ttrpc import ttrpc_pb2

_SCALARS = {
    FieldDescriptor.TYPE_STRING: "string",
    FieldDescriptor.TYPE_BYTES: "bytes",
    FieldDescriptor.TYPE_BOOL: "bool",
    FieldDescriptor.TYPE_INT32: "int32",
    FieldDescriptor.TYPE_INT64: "int64",
    FieldDescriptor.TYPE_UINT32: "uint32",
    FieldDescriptor.TYPE_UINT64: "uint64",
}


def _type(f: FieldDescriptor) -> str:
    if f.message_type is not None:
        return f.message_type.name
    if f.enum_type is not None:
        return f.enum_type.name
    return _SCALARS[f.type]


def render_field(f: FieldDescriptor) -> str:
    """A field as the table writes it: "name=N type", "repeated T", "map<K,V>",
    and "optional T" for proto3 explicit presence."""
    mt = f.message_type
    if mt is not None and mt.GetOptions().map_entry:
        kind = f"map<{_type(mt.fields_by_name['key'])},{_type(mt.fields_by_name['value'])}>"
    elif f.is_repeated:
        kind = f"repeated {_type(f)}"
    elif f.containing_oneof is not None and f.containing_oneof.name == f"_{f.name}":
        kind = f"optional {_type(f)}"
    else:
        kind = _type(f)
    return f"{f.name}={f.number} {kind}"


def render_message(d: Descriptor) -> list[str]:
    return sorted(render_field(f) for f in d.fields)


def parse_table(spec: str) -> list[str]:
    return sorted(s.strip() for s in spec.split(";") if s.strip())


def method_paths(fd: FileDescriptor) -> dict[str, tuple[str, str]]:
    """Every "/package.Service/Method" of a file with its (input, output) message names."""
    return {
        f"/{svc.full_name}/{m.name}": (m.input_type.full_name, m.output_type.full_name)
        for svc in fd.services_by_name.values()
        for m in svc.methods
    }


def check_messages(module: Any, table: dict[str, str]) -> None:
    for name, spec in table.items():
        desc = module.DESCRIPTOR.message_types_by_name.get(name)
        if desc is None:
            # Nested messages are named Outer.Inner.
            outer, _, inner = name.partition(".")
            desc = module.DESCRIPTOR.message_types_by_name[outer].nested_types_by_name[inner]
        assert render_message(desc) == parse_table(spec), name


P = "nri.pkg.api.v1alpha1."

NRI_METHODS = {
    # Runtime service (served by the runtime on conn 2).
    "/nri.pkg.api.v1alpha1.Runtime/RegisterPlugin": ("RegisterPluginRequest", "Empty"),
    "/nri.pkg.api.v1alpha1.Runtime/UpdateContainers": ("UpdateContainersRequest", "UpdateContainersResponse"),
    # Plugin service (served by the plugin on conn 1), v0.2+.
    "/nri.pkg.api.v1alpha1.Plugin/Configure": ("ConfigureRequest", "ConfigureResponse"),
    "/nri.pkg.api.v1alpha1.Plugin/Synchronize": ("SynchronizeRequest", "SynchronizeResponse"),
    "/nri.pkg.api.v1alpha1.Plugin/Shutdown": ("Empty", "Empty"),
    "/nri.pkg.api.v1alpha1.Plugin/CreateContainer": ("CreateContainerRequest", "CreateContainerResponse"),
    "/nri.pkg.api.v1alpha1.Plugin/UpdateContainer": ("UpdateContainerRequest", "UpdateContainerResponse"),
    "/nri.pkg.api.v1alpha1.Plugin/StopContainer": ("StopContainerRequest", "StopContainerResponse"),
    "/nri.pkg.api.v1alpha1.Plugin/StateChange": ("StateChangeEvent", "Empty"),
    # v0.10
    "/nri.pkg.api.v1alpha1.Plugin/UpdatePodSandbox": ("UpdatePodSandboxRequest", "UpdatePodSandboxResponse"),
    "/nri.pkg.api.v1alpha1.Plugin/ValidateContainerAdjustment": (
        "ValidateContainerAdjustmentRequest",
        "ValidateContainerAdjustmentResponse",
    ),
    # v0.12
    "/nri.pkg.api.v1alpha1.Plugin/RunPodSandbox": ("RunPodSandboxRequest", "RunPodSandboxResponse"),
    "/nri.pkg.api.v1alpha1.Plugin/StopPodSandbox": ("StopPodSandboxRequest", "StopPodSandboxResponse"),
    "/nri.pkg.api.v1alpha1.Plugin/RemovePodSandbox": ("RemovePodSandboxRequest", "RemovePodSandboxResponse"),
    "/nri.pkg.api.v1alpha1.Plugin/PostUpdatePodSandbox": (
        "PostUpdatePodSandboxRequest",
        "PostUpdatePodSandboxResponse",
    ),
    "/nri.pkg.api.v1alpha1.Plugin/PostCreateContainer": (
        "PostCreateContainerRequest",
        "PostCreateContainerResponse",
    ),
    "/nri.pkg.api.v1alpha1.Plugin/StartContainer": ("StartContainerRequest", "StartContainerResponse"),
    "/nri.pkg.api.v1alpha1.Plugin/PostStartContainer": (
        "PostStartContainerRequest",
        "PostStartContainerResponse",
    ),
    "/nri.pkg.api.v1alpha1.Plugin/PostUpdateContainer": (
        "PostUpdateContainerRequest",
        "PostUpdateContainerResponse",
    ),
    "/nri.pkg.api.v1alpha1.Plugin/RemoveContainer": ("RemoveContainerRequest", "RemoveContainerResponse"),
    # v0.9, WASM plugins only.
    "/nri.pkg.api.v1alpha1.HostFunctions/Log": ("LogRequest", "Empty"),
}

_POD_AND_CONTAINER = "pod=1 PodSandbox; container=2 Container"

NRI_MESSAGES = {
    # registration, configuration, synchronization
    "Empty": "",
    "RegisterPluginRequest": "plugin_name=1 string; plugin_idx=2 string; NRI_version=3 string",
    "UpdateContainersRequest": "update=1 repeated ContainerUpdate; evict=2 repeated ContainerEviction",
    "UpdateContainersResponse": "failed=1 repeated ContainerUpdate",
    "ConfigureRequest": (
        "config=1 string; runtime_name=2 string; runtime_version=3 string; registration_timeout=4 int64;"
        "request_timeout=5 int64; NRI_version=6 string"
    ),
    "ConfigureResponse": "events=2 int32; request_timeout=3 int64",
    "SynchronizeRequest": "pods=1 repeated PodSandbox; containers=2 repeated Container; more=3 bool",
    "SynchronizeResponse": "update=1 repeated ContainerUpdate; more=2 bool",
    "LogRequest": "msg=1 string; level=2 Level",
    # events
    "StateChangeEvent": "event=1 Event; pod=2 PodSandbox; container=3 Container",
    "RunPodSandboxRequest": "pod=1 PodSandbox",
    "RunPodSandboxResponse": "",
    "StopPodSandboxRequest": "pod=1 PodSandbox",
    "StopPodSandboxResponse": "",
    "RemovePodSandboxRequest": "pod=1 PodSandbox",
    "RemovePodSandboxResponse": "",
    "PostUpdatePodSandboxRequest": "pod=1 PodSandbox",
    "PostUpdatePodSandboxResponse": "",
    "UpdatePodSandboxRequest": (
        "pod=1 PodSandbox; overhead_linux_resources=2 LinuxResources; linux_resources=3 LinuxResources"
    ),
    "UpdatePodSandboxResponse": "",
    "CreateContainerRequest": _POD_AND_CONTAINER,
    "CreateContainerResponse": (
        "adjust=1 ContainerAdjustment; update=2 repeated ContainerUpdate; evict=3 repeated ContainerEviction"
    ),
    "PostCreateContainerRequest": _POD_AND_CONTAINER,
    "PostCreateContainerResponse": "",
    "StartContainerRequest": _POD_AND_CONTAINER,
    "StartContainerResponse": "",
    "PostStartContainerRequest": _POD_AND_CONTAINER,
    "PostStartContainerResponse": "",
    "UpdateContainerRequest": _POD_AND_CONTAINER + "; linux_resources=3 LinuxResources",
    "UpdateContainerResponse": "update=1 repeated ContainerUpdate; evict=2 repeated ContainerEviction",
    "PostUpdateContainerRequest": _POD_AND_CONTAINER,
    "PostUpdateContainerResponse": "",
    "StopContainerRequest": _POD_AND_CONTAINER,
    "StopContainerResponse": "update=1 repeated ContainerUpdate",
    "RemoveContainerRequest": _POD_AND_CONTAINER,
    "RemoveContainerResponse": "",
    "ValidateContainerAdjustmentRequest": (
        "pod=1 PodSandbox; container=2 Container; adjust=3 ContainerAdjustment; update=4 repeated ContainerUpdate;"
        "owners=5 OwningPlugins; plugins=6 repeated PluginInstance"
    ),
    "ValidateContainerAdjustmentResponse": "reject=1 bool; reason=2 string",
    "PluginInstance": "name=1 string; index=2 string",
    "OwningPlugins": "owners=1 map<string,FieldOwners>",
    "FieldOwners": "simple=1 map<int32,string>; compound=2 map<int32,CompoundFieldOwners>",
    "CompoundFieldOwners": "owners=1 map<string,string>",
    # pods
    "PodSandbox": (
        "id=1 string; name=2 string; uid=3 string; namespace=4 string; labels=5 map<string,string>;"
        "annotations=6 map<string,string>; runtime_handler=7 string; linux=8 LinuxPodSandbox; pid=9 uint32;"
        "ips=10 repeated string"
    ),
    "LinuxPodSandbox": (
        "pod_overhead=1 LinuxResources; pod_resources=2 LinuxResources; cgroup_parent=3 string;"
        "cgroups_path=4 string; namespaces=5 repeated LinuxNamespace; resources=6 LinuxResources"
    ),
    "LinuxNamespace": "type=1 string; path=2 string",
    # containers
    "Container": (
        "id=1 string; pod_sandbox_id=2 string; name=3 string; state=4 ContainerState; labels=5 map<string,string>;"
        "annotations=6 map<string,string>; args=7 repeated string; env=8 repeated string; mounts=9 repeated Mount;"
        "hooks=10 Hooks; linux=11 LinuxContainer; pid=12 uint32; rlimits=13 repeated POSIXRlimit;"
        "created_at=14 int64; started_at=15 int64; finished_at=16 int64; exit_code=17 int32;"
        "status_reason=18 string; status_message=19 string; CDI_devices=20 repeated CDIDevice; user=21 User;"
        "image=22 Image"
    ),
    "LinuxContainer": (
        "namespaces=1 repeated LinuxNamespace; devices=2 repeated LinuxDevice; resources=3 LinuxResources;"
        "oom_score_adj=4 OptionalInt; cgroups_path=5 string; io_priority=6 LinuxIOPriority;"
        "seccomp_profile=7 SecurityProfile; seccomp_policy=8 LinuxSeccomp; sysctl=9 map<string,string>;"
        "net_devices=10 map<string,LinuxNetDevice>; scheduler=11 LinuxScheduler; rdt=12 LinuxRdt"
    ),
    "Mount": "destination=1 string; type=2 string; source=3 string; options=4 repeated string",
    "Hooks": (
        "prestart=1 repeated Hook; create_runtime=2 repeated Hook; create_container=3 repeated Hook;"
        "start_container=4 repeated Hook; poststart=5 repeated Hook; poststop=6 repeated Hook"
    ),
    "Hook": "path=1 string; args=2 repeated string; env=3 repeated string; timeout=4 OptionalInt",
    "LinuxDevice": (
        "path=1 string; type=2 string; major=3 int64; minor=4 int64; file_mode=5 OptionalFileMode;"
        "uid=6 OptionalUInt32; gid=7 OptionalUInt32"
    ),
    "CDIDevice": "name=1 string",
    "POSIXRlimit": "type=1 string; hard=2 uint64; soft=3 uint64",
    "User": "uid=1 uint32; gid=2 uint32; additional_gids=3 repeated uint32",
    "Image": "name=1 string; digest=2 string; config_digest=3 string",
    "LinuxNetDevice": "name=1 string",
    "LinuxIOPriority": "class=1 IOPrioClass; priority=2 int32",
    "SecurityProfile": "profile_type=1 ProfileType; localhost_ref=2 string",
    "LinuxSeccomp": (
        "default_action=1 string; default_errno=2 OptionalUInt32; architectures=3 repeated string;"
        "flags=4 repeated string; listener_path=5 string; listener_metadata=6 string;"
        "syscalls=7 repeated LinuxSyscall"
    ),
    "LinuxSyscall": (
        "names=1 repeated string; action=2 string; errno_ret=3 OptionalUInt32; args=4 repeated LinuxSeccompArg"
    ),
    "LinuxSeccompArg": "index=1 uint32; value=2 uint64; value_two=3 uint64; op=4 string",
    "LinuxScheduler": (
        "policy=1 LinuxSchedulerPolicy; nice=2 int32; priority=3 int32; flags=4 repeated LinuxSchedulerFlag;"
        "runtime=5 uint64; deadline=6 uint64; period=7 uint64"
    ),
    "LinuxRdt": (
        "clos_id=1 OptionalString; schemata=2 OptionalRepeatedString; enable_monitoring=3 OptionalBool; remove=4 bool"
    ),
    "LinuxMemoryPolicy": "mode=1 MpolMode; nodes=2 string; flags=3 repeated MpolFlag",
    # resources
    "LinuxResources": (
        "memory=1 LinuxMemory; cpu=2 LinuxCPU; hugepage_limits=3 repeated HugepageLimit;"
        "blockio_class=4 OptionalString; rdt_class=5 OptionalString; unified=6 map<string,string>;"
        "devices=7 repeated LinuxDeviceCgroup; pids=8 LinuxPids"
    ),
    "LinuxMemory": (
        "limit=1 OptionalInt64; reservation=2 OptionalInt64; swap=3 OptionalInt64; kernel=4 OptionalInt64;"
        "kernel_tcp=5 OptionalInt64; swappiness=6 OptionalUInt64; disable_oom_killer=7 OptionalBool;"
        "use_hierarchy=8 OptionalBool"
    ),
    "LinuxCPU": (
        "shares=1 OptionalUInt64; quota=2 OptionalInt64; period=3 OptionalUInt64; realtime_runtime=4 OptionalInt64;"
        "realtime_period=5 OptionalUInt64; cpus=6 string; mems=7 string"
    ),
    "HugepageLimit": "page_size=1 string; limit=2 uint64",
    "LinuxPids": "limit=1 int64",
    "LinuxDeviceCgroup": (
        "allow=1 bool; type=2 string; major=3 OptionalInt64; minor=4 OptionalInt64; access=5 string"
    ),
    # adjustments and updates
    "ContainerAdjustment": (
        "annotations=2 map<string,string>; mounts=3 repeated Mount; env=4 repeated KeyValue; hooks=5 Hooks;"
        "linux=6 LinuxContainerAdjustment; rlimits=7 repeated POSIXRlimit; CDI_devices=8 repeated CDIDevice;"
        "args=9 repeated string"
    ),
    "LinuxContainerAdjustment": (
        "devices=1 repeated LinuxDevice; resources=2 LinuxResources; cgroups_path=3 string;"
        "oom_score_adj=4 OptionalInt; io_priority=5 LinuxIOPriority; seccomp_policy=6 LinuxSeccomp;"
        "namespaces=7 repeated LinuxNamespace; sysctl=8 map<string,string>;"
        "net_devices=9 map<string,LinuxNetDevice>; scheduler=10 LinuxScheduler; rdt=11 LinuxRdt;"
        "memory_policy=12 LinuxMemoryPolicy"
    ),
    "ContainerUpdate": "container_id=1 string; linux=2 LinuxContainerUpdate; ignore_failure=3 bool",
    "LinuxContainerUpdate": "resources=1 LinuxResources",
    "ContainerEviction": "container_id=1 string; reason=2 string",
    "KeyValue": "key=1 string; value=2 string",
    # optional wrappers
    "OptionalString": "value=1 string",
    "OptionalRepeatedString": "value=1 repeated string",
    "OptionalInt": "value=1 int64",
    "OptionalInt32": "value=1 int32",
    "OptionalUInt32": "value=1 uint32",
    "OptionalInt64": "value=1 int64",
    "OptionalUInt64": "value=1 uint64",
    "OptionalBool": "value=1 bool",
    "OptionalFileMode": "value=1 uint32",
}

NRI_ENUMS = {
    "Event": {
        "UNKNOWN": 0,
        "RUN_POD_SANDBOX": 1,
        "STOP_POD_SANDBOX": 2,
        "REMOVE_POD_SANDBOX": 3,
        "CREATE_CONTAINER": 4,
        "POST_CREATE_CONTAINER": 5,
        "START_CONTAINER": 6,
        "POST_START_CONTAINER": 7,
        "UPDATE_CONTAINER": 8,
        "POST_UPDATE_CONTAINER": 9,
        "STOP_CONTAINER": 10,
        "REMOVE_CONTAINER": 11,
        "UPDATE_POD_SANDBOX": 12,
        "POST_UPDATE_POD_SANDBOX": 13,
        "VALIDATE_CONTAINER_ADJUSTMENT": 14,
        "LAST": 15,
    },
    "ContainerState": {
        "CONTAINER_UNKNOWN": 0,
        "CONTAINER_CREATED": 1,
        "CONTAINER_PAUSED": 2,
        "CONTAINER_RUNNING": 3,
        "CONTAINER_STOPPED": 4,
    },
    "IOPrioClass": {
        "IOPRIO_CLASS_NONE": 0,
        "IOPRIO_CLASS_RT": 1,
        "IOPRIO_CLASS_BE": 2,
        "IOPRIO_CLASS_IDLE": 3,
    },
    "LinuxSchedulerPolicy": {
        "SCHED_NONE": 0,
        "SCHED_OTHER": 1,
        "SCHED_FIFO": 2,
        "SCHED_RR": 3,
        "SCHED_BATCH": 4,
        "SCHED_ISO": 5,
        "SCHED_IDLE": 6,
        "SCHED_DEADLINE": 7,
    },
    "LinuxSchedulerFlag": {
        "SCHED_FLAG_RESET_ON_FORK": 0,
        "SCHED_FLAG_RECLAIM": 1,
        "SCHED_FLAG_DL_OVERRUN": 2,
        "SCHED_FLAG_KEEP_POLICY": 3,
        "SCHED_FLAG_KEEP_PARAMS": 4,
        "SCHED_FLAG_UTIL_CLAMP_MIN": 5,
        "SCHED_FLAG_UTIL_CLAMP_MAX": 6,
    },
    "MpolMode": {
        "MPOL_DEFAULT": 0,
        "MPOL_PREFERRED": 1,
        "MPOL_BIND": 2,
        "MPOL_INTERLEAVE": 3,
        "MPOL_LOCAL": 4,
        "MPOL_PREFERRED_MANY": 5,
        "MPOL_WEIGHTED_INTERLEAVE": 6,
    },
    "MpolFlag": {"MPOL_F_STATIC_NODES": 0, "MPOL_F_RELATIVE_NODES": 1, "MPOL_F_NUMA_BALANCING": 2},
}

NRI_NESTED_ENUMS = {
    ("LogRequest", "Level"): {
        "LEVEL_UNSPECIFIED": 0,
        "LEVEL_DEBUG": 1,
        "LEVEL_INFO": 2,
        "LEVEL_WARN": 3,
        "LEVEL_ERROR": 4,
    },
    ("SecurityProfile", "ProfileType"): {"RUNTIME_DEFAULT": 0, "UNCONFINED": 1, "LOCALHOST": 2},
}


def test_nri_package() -> None:
    assert nri_pb2.DESCRIPTOR.package == "nri.pkg.api.v1alpha1"
    assert set(nri_pb2.DESCRIPTOR.services_by_name) == {"Runtime", "Plugin", "HostFunctions"}


def test_nri_full_method_names() -> None:
    want = {path: (P + i, P + o) for path, (i, o) in NRI_METHODS.items()}
    assert method_paths(nri_pb2.DESCRIPTOR) == want


def test_nri_every_message_is_in_the_table() -> None:
    assert set(nri_pb2.DESCRIPTOR.message_types_by_name) == set(NRI_MESSAGES)


@pytest.mark.parametrize("name", sorted(NRI_MESSAGES))
def test_nri_message_fields(name: str) -> None:
    check_messages(nri_pb2, {name: NRI_MESSAGES[name]})


@pytest.mark.parametrize("name", sorted(NRI_ENUMS))
def test_nri_enum_values(name: str) -> None:
    enum = nri_pb2.DESCRIPTOR.enum_types_by_name[name]
    assert {v.name: v.number for v in enum.values} == NRI_ENUMS[name]


def test_nri_nested_enums_and_no_other_enums() -> None:
    assert set(nri_pb2.DESCRIPTOR.enum_types_by_name) == set(NRI_ENUMS)
    for (outer, inner), values in NRI_NESTED_ENUMS.items():
        enum = nri_pb2.DESCRIPTOR.message_types_by_name[outer].enum_types_by_name[inner]
        assert {v.name: v.number for v in enum.values} == values


def test_nri_python_names_keep_upstream_capitals() -> None:
    assert nri_pb2.RegisterPluginRequest(NRI_version="v0.6.1").NRI_version == "v0.6.1"
    assert nri_pb2.ContainerAdjustment(CDI_devices=[nri_pb2.CDIDevice(name="dra.net/nic=eth1")]).CDI_devices
    assert nri_pb2.ConfigureResponse.DESCRIPTOR.fields_by_name["events"].number == 2


def test_nri_known_bytes() -> None:
    """Spot checks of the encoding itself for messages the stub sends."""
    assert nri_pb2.ConfigureResponse(events=0x0F).SerializeToString() == b"\x10\x0f"
    reg = nri_pb2.RegisterPluginRequest(plugin_name="dra.net", plugin_idx="00").SerializeToString()
    assert reg == b"\x0a\x07dra.net\x12\x0200"
    assert nri_pb2.SynchronizeResponse(more=True).SerializeToString() == b"\x10\x01"


TTRPC_MESSAGES = {
    "Request": (
        "service=1 string; method=2 string; payload=3 bytes; timeout_nano=4 int64; metadata=5 repeated KeyValue"
    ),
    "Response": "status=1 Status; payload=2 bytes",
    "StringList": "list=1 repeated string",
    "KeyValue": "key=1 string; value=2 string",
}


def test_ttrpc_messages() -> None:
    assert ttrpc_pb2.DESCRIPTOR.package == "ttrpc"
    assert set(ttrpc_pb2.DESCRIPTOR.message_types_by_name) == set(TTRPC_MESSAGES)
    check_messages(ttrpc_pb2, TTRPC_MESSAGES)
    status = ttrpc_pb2.Response.DESCRIPTOR.fields_by_name["status"].message_type
    assert status.full_name == "google.rpc.Status"


def test_google_rpc_status() -> None:
    assert status_pb2.DESCRIPTOR.package == "google.rpc"
    check_messages(status_pb2, {"Status": "code=1 int32; message=2 string; details=3 repeated Any"})
    details = status_pb2.Status.DESCRIPTOR.fields_by_name["details"].message_type
    assert details.full_name == "google.protobuf.Any"
    assert status_pb2.Status(code=12, message="method X").SerializeToString() == b"\x08\x0c\x12\x08method X"
