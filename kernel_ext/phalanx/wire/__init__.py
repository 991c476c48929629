"""The wire: what the kernel and the engines both stand on.

The seam types of a run (``RunSpec``, ``RankResult``, ``GroupSpec`` ...), the option bag, the
rendezvous store's protocol, the picklers that carry the notebook's objects both ways, the
CurveZMQ keys, the control-channel requests and the plugin registries.  Everything here is pure
or imports its heavy dependency (torch, numpy, cloudpickle) where it is used: the kernel imports
the wire without loading numpy.  It imports nothing else of phalanx.
"""
