"""The names of the requests an engine answers on ipyparallel's control channel, even while a
run keeps it busy: the kernel sends them, the engines' debug room answers them
(:mod:`phalanx.runtime.run._control_channel`)."""

STACKS_REQUEST = "phalanx_stacks_request"  # every rank's main-thread stack, now
DEBUG_REQUEST = "phalanx_debug_request"    # one debugger command for a paused rank
HOLD_REQUEST = "phalanx_hold_request"      # hold the other ranks' deadlines while one is paused
PAUSE_KEY = "phalanx_pause"                # the store key a paused rank announces itself under
