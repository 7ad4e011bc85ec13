"""Protobuf/gRPC stubs for the kubelet APIs vgpuctl serves or calls.

The ``.proto`` files here were written for vgpuctl from the documented field
lists (see ``README.md``); the ``*_pb2.py``, ``*_pb2.pyi`` and ``*_pb2_grpc.py``
modules are generated from them with ``grpc_tools.protoc`` and must not be
edited by hand.

Modules (proto package -> module):

- ``k8s.io.kubelet.pkg.apis.dra.v1``      -> ``vgpuctl_dra_v1_pb2[_grpc]``
- ``k8s.io.kubelet.pkg.apis.dra.v1beta1`` -> ``vgpuctl_dra_v1beta1_pb2[_grpc]``
- ``pluginregistration``                  -> ``vgpuctl_pluginregistration_pb2[_grpc]``
- ``v1alpha1`` (DRA health)               -> ``vgpuctl_dra_health_v1alpha1_pb2[_grpc]``
- ``v1`` (DRA health)                     -> ``vgpuctl_dra_health_v1_pb2[_grpc]``
- ``v1beta1`` (device plugin)             -> ``vgpuctl_deviceplugin_v1beta1_pb2[_grpc]``
- ``v1`` (PodResources)                   -> ``vgpuctl_podresources_v1_pb2[_grpc]``
"""
