"""The run's life on an engine: the cell's entry point, the engine's state, the warm process
group and its rendezvous client, interrupts, what a run returns or leaves live, the GPU and CPU
threads it takes, and the ledger of what it changed in other libraries.

May import the wire, the transport and the runtime's other rooms; never the kernel's side.
"""
