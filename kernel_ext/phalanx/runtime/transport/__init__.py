"""Transports: how the engines of a run exchange arrays, behind the ``Communicator`` interface.

- :mod:`._comm`: the ``Communicator`` protocol, the in-process ``ThreadCommunicator`` used to test
  sync strategies, and lazy access to the heavy transports below;
- :mod:`._comm_errors`: the collective errors every transport raises (a leaf: imports nothing of
  phalanx);
- :mod:`._comm_util`: what the transports share (input checks, numpy views, liveness, backoff);
- :mod:`._shm` with :mod:`._shm_segment`, :mod:`._shm_layout`, :mod:`._shm_wait` and
  :mod:`._shm_futex`: POSIX shared memory between the processes of one host;
- :mod:`._comm_torch`: torch.distributed (gloo, nccl), any hosts;
- :mod:`._comm_mpi`: mpi4py, where engines run under MPI.

Importing this package imports nothing: a cell's runtime loads the transport its group uses.
"""
