"""Kubeconfig files as kubectl reads them, without the Kubernetes client (which costs most of a
second to import): which files, which context, and the one-line errors for a kubeconfig that cannot
be used or a server that does not answer. :mod:`.client` builds the client's configuration after
these checks; :mod:`.reader` reads a cluster with them alone where the kubeconfig is a plain one.
"""

from __future__ import annotations

import os
import re

from mdev_manager.yamlfile import YamlFileError, load_yaml

PROBE_TIMEOUT = 5.0  # seconds per attempt; the client retries a refused connection 3 times


class KubeconfigError(ValueError):
    """The kubeconfig (or the in-cluster config) cannot be used; the message says which and why."""


class ApiUnreachable(ValueError):
    """The API server named by the kubeconfig did not answer, or refused the credentials."""


def _kubeconfig_paths(kubeconfig: str | None) -> list[str]:
    """The files a kubeconfig is read from: the flag's, else $KUBECONFIG's list, else ~/.kube/config."""
    if kubeconfig:
        return [kubeconfig]
    env = os.environ.get("KUBECONFIG")
    if env:
        return [p for p in env.split(os.pathsep) if p]
    return [os.path.expanduser("~/.kube/config")]


def _check_files(kubeconfig: str | None) -> list[str]:
    """Each kubeconfig file that will be read, as YAML (bounded; duplicate keys refused)."""
    paths = _kubeconfig_paths(kubeconfig)
    present = paths if kubeconfig else [p for p in paths if os.path.exists(os.path.expanduser(p))]
    if not present:
        source = "$KUBECONFIG (" + os.environ["KUBECONFIG"] + ")" if os.environ.get("KUBECONFIG") else paths[0]
        raise KubeconfigError(f"no kubeconfig: {source} does not exist; pass --kubeconfig FILE "
                              "(or set $KUBECONFIG, or run in a pod)")
    for path in present:
        try:
            doc = load_yaml(os.path.expanduser(path), what="kubeconfig")
        except YamlFileError as exc:
            raise KubeconfigError(f"kubeconfig {exc}") from None
        if not isinstance(doc, dict):
            raise KubeconfigError(f"kubeconfig {path}: not a kubeconfig (expected a mapping with clusters, users, "
                                  "contexts); check the path")
    return present


def _in_cluster(kubeconfig: str | None) -> bool:
    """kubectl's order: the flag, ``$KUBECONFIG``, ``~/.kube/config``; the in-cluster service account
    only when none of them names a file and the pod's environment is there."""
    if kubeconfig or os.environ.get("KUBECONFIG") or os.path.exists(os.path.expanduser("~/.kube/config")):
        return False
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


def _check_context(files: list[str], context: str | None) -> None:
    """The context asked for (``--context``, else the current-context) is one the files define: said in
    one line naming it, the files and the contexts they have (the client's own text names a list path)."""
    names: list[str] = []
    current = None
    for path in files:
        doc = load_yaml(os.path.expanduser(path), what="kubeconfig")
        names += [c["name"] for c in doc.get("contexts") or [] if isinstance(c, dict) and isinstance(c.get("name"), str)]
        current = current or doc.get("current-context")
    wanted = context or current
    if not isinstance(wanted, str) or not wanted or wanted in names:
        return  # none named: the client says what is missing
    where = ", ".join(files)
    have = f"its contexts: {', '.join(names)}" if names else "it defines no context"
    if context:
        raise KubeconfigError(f"--context {context}: no such context in kubeconfig {where} ({have}); "
                              f"`kubectl config get-contexts --kubeconfig {files[0]}` lists them")
    raise KubeconfigError(f"kubeconfig {where}: its current-context {wanted} is not one of its contexts ({have}); "
                          "pass --context NAME, or fix current-context")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _reason(exc: BaseException) -> str:
    """The root of a urllib3 error, without its pool and host boilerplate: ``Connection refused``."""
    reason = getattr(exc, "reason", None) or exc
    text = _first_line(reason)
    text = text.rsplit("Failed to establish a new connection: ", 1)[-1]
    return re.sub(r"^\[Errno -?\d+\] ", "", text)
