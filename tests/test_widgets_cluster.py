"""The cluster widget and the cluster status table with a fake session and real widget objects
(no cluster); the widget on a real cluster is tested in test_widgets_real_cluster.py."""

from __future__ import annotations

from types import SimpleNamespace

from IPython.core.interactiveshell import InteractiveShell

from phalanx._bus import EventBus
from phalanx.widgets import ClusterStatus, cluster_view


def test_cluster_widget_says_what_waits_for_the_run():
    from phalanx.events import cluster_state
    from phalanx.widgets import ClusterWidget

    bus = EventBus()
    engine = {"rank": 0, "engine_id": 0, "host": "h", "pid": None, "device": "cpu",
              "state": "busy", "memory_mb": None, "step": None}
    session = SimpleNamespace(events=bus, max_engines=4, status=None, size=1, running=False,
                              launcher="local")
    panel = ClusterWidget(session)
    bus.emit(cluster_state([engine], 4, notice="scale to 2 after run-3"))   # + during a run
    assert "scale to 2 after run-3" in panel.message.value
    bus.emit(cluster_state([engine, {**engine, "rank": 1}], 4))               # applied after it
    assert "after run-3" not in panel.message.value
    panel.close()


def test_cluster_widget_shows_a_change_made_elsewhere():
    from phalanx.events import cluster_state
    from phalanx.widgets import ClusterWidget

    bus = EventBus()
    session = SimpleNamespace(events=bus, max_engines=4, status=None, size=0, running=False,
                              launcher="local")
    panel = ClusterWidget(session)
    assert "not running" in panel.title.value and not panel.start_button.disabled
    engine = {"rank": 0, "engine_id": 0, "host": "h", "pid": None, "device": "cpu",
              "state": "starting", "memory_mb": None, "step": None}
    bus.emit(cluster_state([engine], 4, busy=True))                 # e.g. %cluster start elsewhere
    assert panel.plus.disabled and panel.start_button.disabled
    assert "the cluster is changing" in panel.message.value
    bus.emit(cluster_state([{**engine, "state": "idle"}], 4))
    assert not panel.plus.disabled and panel.count.value == 1 and "limit 4" in panel.title.value
    assert panel.message.value == ""
    panel.close()


def test_the_sessions_engine_status_shows_as_the_table_of_cluster_status():
    from phalanx._magics import register
    from phalanx._session import EngineStatus

    shell = InteractiveShell.instance()
    register(shell)     # %load_ext phalanx
    engine = {"rank": 0, "engine_id": 3, "host": "h", "pid": 9, "device": "cpu",
              "state": "idle", "memory_mb": None, "step": None}
    shown, _ = shell.display_formatter.format(EngineStatus([engine], "local"))
    assert shown["text/plain"] == repr(ClusterStatus([engine], "local"))
    assert shown["text/plain"].startswith("1 engine(s), local launcher")
    assert "<table>" in shown["text/html"]
    session = SimpleNamespace(status=lambda: EngineStatus([], "local"), shell=shell)
    assert "no cluster is running" in repr(cluster_view(session))   # a terminal: the table
