"""vgpuctl: the composition root.

The command line and the wiring live here: ``cli`` (the parser, the shared option definitions, the
command table, errors as one line), ``commands`` (one module per command: it parses, calls the
libraries, prints) and ``output`` (tables, ``-o json|yaml|wide``, the terminal). The libraries
(``mdev_manager``, ``dra_bridge``, ``kubevirt_templates``) never import this package.
"""

__version__ = "0.1.0"
