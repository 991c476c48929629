"""How often the controller and its engines check on each other, and when each gives up.

The controller pings every engine each ``HEARTBEAT_MS`` and unregisters one that missed
``CONTROLLER_GIVES_UP_S`` worth of pings; an engine checks for the controller's pings every
``HEARTBEAT_MS + 500`` ms (ipyparallel's rule) and exits after ``ENGINE_GIVES_UP_S`` without
them, so a lost controller leaves no engine waiting for it for minutes.

The period is short because a new engine counts as registered only once the controller has had
its first heartbeat: at 1 s, every ``%cluster start``, restart and scale-up waited for up to a
second of it (measured: 2.0 s from launch to a registered forked engine at 1000 ms, 1.2 s at
200 ms).  A ping is a few bytes through zmq, answered by a C thread of the engine that needs no
GIL, so a busy engine still answers; the times to give up stay what they were.
"""

from __future__ import annotations

import math

HEARTBEAT_MS = 200
CONTROLLER_GIVES_UP_S = 5.0
ENGINE_GIVES_UP_S = 15.0
_ENGINE_CHECK_MS = HEARTBEAT_MS + 500  # ipyparallel's engine checks a little slower than pings

CONTROLLER_ARGS = [f"--HeartMonitor.period={HEARTBEAT_MS}",
                   "--HeartMonitor.max_heartmonitor_misses="
                   f"{math.ceil(CONTROLLER_GIVES_UP_S * 1000 / HEARTBEAT_MS)}"]
ENGINE_ARGS = ["--IPEngine.max_heartbeat_misses="
               f"{math.ceil(ENGINE_GIVES_UP_S * 1000 / _ENGINE_CHECK_MS)}"]
