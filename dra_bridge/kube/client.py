"""API clients: the one place a ``kubernetes.client.ApiClient`` is made.

The ``kubernetes`` package is imported lazily (it costs tens of MB and most commands never
talk to a cluster).
"""

from __future__ import annotations

import os


def api_client_from(kubeconfig: str | None):
    """In-cluster config when running in a pod, else the kubeconfig (flag, $KUBECONFIG, ~/.kube/config)."""
    from kubernetes import client, config

    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config()
        return client.ApiClient()
    cfg = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    return client.ApiClient(cfg)


def plain_http_configuration(url: str):
    """A ``kubernetes.client.Configuration`` for a local server on plain HTTP with no auth."""
    from kubernetes import client

    cfg = client.Configuration(host=url, no_proxy="127.0.0.1,localhost")
    cfg.verify_ssl = False
    return cfg


def plain_http_client(url: str):
    """An ``ApiClient`` for :func:`plain_http_configuration`; the caller closes it."""
    from kubernetes import client

    return client.ApiClient(plain_http_configuration(url))
