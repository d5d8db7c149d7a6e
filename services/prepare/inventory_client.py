"""prepare's client of the inventory's dranet.inventory.v1 API."""

from __future__ import annotations

import os

import grpc

from proto.dranet.inventory.v1 import inventory_pb2 as pb
from proto.dranet.inventory.v1 import inventory_pb2_grpc
from shared.rpc import channel

CALL_TIMEOUT_S = 5.0
# A webhook or cloud metadata call sits behind ResolveProfile.
PROFILE_TIMEOUT_S = 20.0


class InventoryError(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class InventoryClient:
    def __init__(self, socket_path: str | os.PathLike[str]) -> None:
        self._channel = channel(socket_path)
        self.stub = inventory_pb2_grpc.InventoryStub(self._channel)
        self.socket_path = os.fspath(socket_path)

    async def close(self) -> None:
        await self._channel.close()

    async def _call(self, method: str, request: object, deadline_s: float = CALL_TIMEOUT_S) -> object:
        try:
            return await getattr(self.stub, method)(request, timeout=deadline_s, wait_for_ready=True)
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            details = exc.details() or code.name
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                details = f"inventory at {self.socket_path} unavailable: {details}"
            raise InventoryError(code, details) from None

    async def get_device(self, name: str) -> pb.Device | None:
        """The device with its host snapshot, or None when the node has no such device."""
        try:
            resp = await self._call("GetDevice", pb.GetDeviceRequest(name=name, with_snapshot=True))
        except InventoryError as exc:
            if exc.code == grpc.StatusCode.NOT_FOUND:
                return None
            raise
        assert isinstance(resp, pb.Device)
        return resp

    async def node_info(self) -> pb.NodeInfo:
        resp = await self._call("GetNodeInfo", pb.GetNodeInfoRequest())
        assert isinstance(resp, pb.NodeInfo)
        return resp

    async def resolve_profile(
        self, device: str, claim_uid: str, pod_uid: str, profile: str, config_json: str
    ) -> str:
        resp = await self._call(
            "ResolveProfile",
            pb.ResolveProfileRequest(
                device=device, claim_uid=claim_uid, profile=profile, pod_uid=pod_uid, config_json=config_json
            ),
            deadline_s=PROFILE_TIMEOUT_S,
        )
        assert isinstance(resp, pb.ResolveProfileResponse)
        return resp.config_json

    async def release_profile(self, device: str, claim_uid: str, profile: str, config_json: str) -> None:
        await self._call(
            "ReleaseProfile",
            pb.ReleaseProfileRequest(
                device=device, claim_uid=claim_uid, profile=profile, config_json=config_json
            ),
            deadline_s=PROFILE_TIMEOUT_S,
        )
