"""The development control plane: a Kubernetes API server test double, an allocator
that plays the scheduler's DRA part, a kubelet emulator and a real containerd fixture.

Tests and ``dranet up`` run our services against it because no real kube-apiserver or
kubelet can be installed on these machines; where it differs from Kubernetes, it says so.
"""
