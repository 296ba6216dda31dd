"""The Prometheus exporter: metrics as a pure function of hand-built Observations, the text a scrape
gets (parsed back with prometheus_client's own parser), ``--prometheus`` parsing and a port in use."""

from __future__ import annotations

import dataclasses
import socket
import urllib.request

import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from tests.unit.prom import JOB, free_port, samples, two_ranks
from torchwatch.analysis.features import CATALOGUE
from torchwatch.cli import main
from torchwatch.exposition import MetricsServer, parse_listen
from torchwatch.faces.prometheus import (
    ObservationCollector,
    feature_metric,
    job_keys,
    metric_families,
)
from torchwatch.model.errors import TorchwatchError, UsageError
from torchwatch.model.hang import HangProcess, HangView
from torchwatch.model.observation import (
    Observation,
    ProcessRow,
    RankView,
    StepsView,
    TargetView,
)
from torchwatch.model.origin import Origin
from torchwatch.wire import RankInfo

POD = "1b4c6d2e-9f2e-4a1b-8c3d-5e6f7a8b9c0d"
OWNER = Origin(1000, "4f3c2a1b0e9d", POD)


def value(got: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    """The one sample of ``name`` whose labels include ``labels``."""
    hits = [v for (n, ls), v in got.items() if n == name and set(labels.items()) <= ls]
    assert len(hits) == 1, (name, labels, hits)
    return hits[0]


def test_per_rank_step_wait_cpu_rss_in_base_units() -> None:
    got = samples([two_ranks()], {100: OWNER})
    assert value(got, "torchwatch_step_time_seconds", rank="0") == pytest.approx(0.2)
    assert value(got, "torchwatch_step_time_seconds", rank="1") == pytest.approx(0.2)
    assert value(got, "torchwatch_step_time_p95_seconds", rank="1") == pytest.approx(0.4)
    assert value(got, "torchwatch_data_wait_seconds", rank="1") == pytest.approx(0.09)
    assert value(got, "torchwatch_data_wait_ratio", rank="1") == pytest.approx(0.45)
    assert value(got, "torchwatch_collective_wait_seconds", rank="0") == pytest.approx(0.08)
    assert value(got, "torchwatch_steps_per_second", rank="0") == pytest.approx(5.0)
    assert value(got, "torchwatch_steps_total", rank="1") == 121
    assert value(got, "torchwatch_cpu_ratio", rank="0") == pytest.approx(0.95)
    assert value(got, "torchwatch_resident_memory_bytes", rank="1") == 3 << 29
    labels = next(ls for (n, ls) in got if n == "torchwatch_step_time_seconds" and ("rank", "1") in ls)
    assert dict(labels) == {
        **{"rank": "1", "local_rank": "1", "training_job": JOB, "host": "node1", "world_size": "2"},
        **{"uid": "1000", "container_id": "4f3c2a1b0e9d", "pod_uid": POD},
    }
    # the quantities the cross-node straggler rule compares (torchwatch.analysis.ranks: arrive_ms)
    assert value(got, "torchwatch_time_to_backward_seconds", rank="0") == pytest.approx(0.12)
    assert value(got, "torchwatch_time_to_backward_seconds", rank="1") == pytest.approx(0.2)
    assert value(got, "torchwatch_compute_seconds", rank="1") == pytest.approx(0.11)
    assert value(got, "torchwatch_window_steps", rank="0") == 10
    assert not [k for k in got if ("pid", "201") in k[1] or ("pid", "202") in k[1]]  # no PID label anywhere


def test_verdict_is_a_labelled_gauge_with_the_top_finding() -> None:
    got = samples([two_ranks()])
    assert value(got, "torchwatch_verdict", label="dataloader-bound", top_finding="loader-cpu-in-workers") == 1
    assert value(got, "torchwatch_verdict_confidence", training_job=JOB) == pytest.approx(0.8)
    assert value(got, "torchwatch_rank_verdict", rank="0", label="undetermined", top_finding="rule-0") == 1
    assert value(got, "torchwatch_straggler_score", rank="1") == pytest.approx(0.4)
    labels = next(ls for (n, ls) in got if n == "torchwatch_verdict")
    assert {k for k, _ in labels} == {"training_job", "uid", "container_id", "pod_uid", "host", "label", "top_finding"}


def test_hang_state_for_alerts() -> None:
    calm = samples([two_ranks()])
    assert value(calm, "torchwatch_hang", training_job=JOB) == 0
    assert value(calm, "torchwatch_hangs_total", training_job=JOB) == 0
    assert not [k for k in calm if k[0] == "torchwatch_stall_seconds"]
    assert value(calm, "torchwatch_rank_hang", rank="0") == 0 and value(calm, "torchwatch_rank_hang", rank="1") == 0
    hang = HangView("hang", 202, 1, 5.0, "--hang-after", 40.0, 45.9, 5.9, 7.5, number=2)
    stuck = samples([dataclasses.replace(two_ranks(), hang=hang)])
    assert value(stuck, "torchwatch_hang", training_job=JOB) == 1
    assert value(stuck, "torchwatch_hangs_total", training_job=JOB) == 2
    assert value(stuck, "torchwatch_stall_seconds", rank="1", state="hang") == pytest.approx(7.5)
    assert value(stuck, "torchwatch_rank_hang", rank="1", training_job=JOB) == 1  # its step clock ran out
    assert value(stuck, "torchwatch_rank_hang", rank="0") == 0
    resumed = dataclasses.replace(hang, state="stall", resumed_s=52.0)
    after = samples([dataclasses.replace(two_ranks(), hang=resumed)])
    assert value(after, "torchwatch_hang", training_job=JOB) == 0
    assert value(after, "torchwatch_stall_seconds", rank="1", state="stall") == pytest.approx(7.5)
    assert value(after, "torchwatch_rank_hang", rank="1") == 0


def test_rank_hang_state_names_the_rank_not_waiting_on_its_peers() -> None:
    rows = (
        HangProcess(201, "rank", 0, None, "backward"),
        HangProcess(202, "rank", 1, None, "elsewhere", top_frame="wait_for_token (x.py:3)"),
        HangProcess(250, "worker", None, 202, "idle"),
    )
    hang = HangView("hang", 201, 0, 5.0, "--hang-after", 40.0, 45.9, 5.9, 7.5, processes=rows)
    got = samples([dataclasses.replace(two_ranks(), hang=hang)])
    assert value(got, "torchwatch_rank_hang_state", rank="1", state="elsewhere") == 1
    assert value(got, "torchwatch_rank_hang_state", rank="0", state="backward") == 1
    assert len([k for k in got if k[0] == "torchwatch_rank_hang_state"]) == 2  # a worker is no rank
    assert value(got, "torchwatch_rank_hang", rank="0") == 1
    resumed = samples([dataclasses.replace(two_ranks(), hang=dataclasses.replace(hang, state="stall"))])
    assert not [k for k in resumed if k[0] == "torchwatch_rank_hang_state"]  # only while it hangs


def test_gpus_with_gpm_only_when_read() -> None:
    got = samples([two_ranks()])
    assert value(got, "torchwatch_gpu_utilization_ratio", gpu="0", uuid="GPU-0000") == pytest.approx(0.97)
    assert value(got, "torchwatch_gpu_power_watts", gpu="1") == 350.0
    assert value(got, "torchwatch_gpu_memory_used_bytes", gpu="1") == 10 << 30
    assert value(got, "torchwatch_gpu_sm_active_ratio", gpu="0") == pytest.approx(0.45)
    assert not [k for k in got if k[0] == "torchwatch_gpu_sm_active_ratio" and ("gpu", "1") in k[1]]


def test_gpus_also_under_the_opentelemetry_hardware_names() -> None:
    got = samples([two_ranks()])
    otel = {"hw_id": "GPU-0001", "hw_name": "NVIDIA H100", "hw_type": "gpu", "host": "node1"}
    assert value(got, "hw_gpu_utilization_ratio", hw_gpu_task="general", **otel) == pytest.approx(0.97)
    assert value(got, "hw_gpu_memory_usage_bytes", **otel) == 10 << 30
    assert value(got, "hw_gpu_memory_limit_bytes", **otel) == 80 << 30
    assert value(got, "hw_gpu_memory_utilization_ratio", **otel) == pytest.approx(0.125)
    assert value(got, "hw_power_watts", **otel) == 350.0


def test_features_named_from_the_catalogue_unmeasured_absent() -> None:
    got = samples([two_ranks()])
    assert value(got, "torchwatch_feature_data_wait_ratio", rank="1") == pytest.approx(0.25)
    assert value(got, "torchwatch_feature_main_cpu_ratio") == pytest.approx(1.5)
    assert value(got, "torchwatch_feature_step_time_p50_seconds") == pytest.approx(0.2)
    assert value(got, "torchwatch_feature_rss_bytes") == 2e9
    assert not [k for k in got if "read_bytes" in k[0]]  # None: no sample, never 0


def test_help_text_comes_from_the_catalogue() -> None:
    fams = {f.name: f for f in metric_families([two_ranks()], "node1")}
    assert fams["torchwatch_step_time_seconds"].documentation.startswith(CATALOGUE["step_time_p50_ms"].doc)
    assert fams["torchwatch_feature_data_wait_ratio"].documentation.startswith(CATALOGUE["data_wait_share"].doc)


def test_every_catalogue_feature_has_its_own_conventional_name() -> None:
    names = [feature_metric(spec)[0] for spec in CATALOGUE.values()]
    assert len(set(names)) == len(names)
    for spec in CATALOGUE.values():
        name, factor = feature_metric(spec)
        if spec.unit in ("share", "%"):
            assert name.endswith("_ratio") and factor == (0.01 if spec.unit == "%" else 1.0)
        if spec.unit in ("ms", "s"):
            assert name.endswith("_seconds") and "_ms_" not in name
        if spec.unit == "bytes":
            assert name.endswith("_bytes") and not name.endswith("_bytes_bytes")


def test_self_cost_and_targets() -> None:
    got = samples([two_ranks()])
    assert value(got, "torchwatch_self_cpu_seconds_total", part="py-spy") == 1.5
    assert value(got, "torchwatch_self_cpu_ratio") == pytest.approx(4.5 / 30)
    assert value(got, "torchwatch_self_resident_memory_max_bytes") == 80 << 20
    assert value(got, "torchwatch_targets") == 1
    assert samples([]) == {("torchwatch_targets", frozenset({("host", "node1")})): 0.0}


def test_one_process_without_readings_uses_the_hook_step_times() -> None:
    obs = Observation(
        t=1.0,
        elapsed_s=5.0,
        window_s=10.0,
        target=TargetView(300),
        ranks={0: RankView(0, 300, steps=StepsView(status="ok", pid=300, p50_ms=50.0, steps=7))},
        processes=(ProcessRow(300, "main", "python", 40.0, 1 << 20, None, "R1", 1),),
    )
    got = samples([obs])
    # no job identity: the training's own key, world size 1
    labels = {"rank": "0", "training_job": "pid:300", "local_rank": "", "world_size": "1"}
    assert value(got, "torchwatch_step_time_seconds", **labels) == pytest.approx(0.05)
    assert value(got, "torchwatch_hang", training_job="pid:300") == 0
    assert value(got, "torchwatch_cpu_ratio", rank="0") == pytest.approx(0.4)
    assert not [k for k in got if k[0] == "torchwatch_verdict"]  # no analysis yet: no verdict


def test_same_gpu_seen_by_two_trainings_is_exported_once() -> None:
    got = samples([two_ranks(), two_ranks()])
    assert len([k for k in got if k[0] == "torchwatch_gpu_power_watts"]) == 2
    assert value(got, "torchwatch_targets") == 2


@pytest.mark.parametrize(
    ("text", "want"),
    [("9400", ("127.0.0.1", 9400)), ("0.0.0.0:80", ("0.0.0.0", 80)), ("[::1]:9400", ("::1", 9400))],
)
def test_parse_listen(text: str, want: tuple[str, int]) -> None:
    assert parse_listen(text) == want


@pytest.mark.parametrize("text", ["", "abc", "0", "70000", ":9400", "host:"])
def test_parse_listen_rejects(text: str) -> None:
    with pytest.raises(UsageError):
        parse_listen(text)


def test_server_serves_metrics_and_stops() -> None:
    port = free_port()
    server = MetricsServer(ObservationCollector(lambda: [two_ranks()], "node1"), "127.0.0.1", port)
    try:
        body = urllib.request.urlopen(server.url, timeout=5).read().decode()
        want = (
            f'torchwatch_step_time_seconds{{container_id="",host="node1",local_rank="1",pod_uid="",rank="1",'
            f'training_job="{JOB}",uid="",world_size="2"}}'
        )
        assert want in body, body[:2000]
    finally:
        server.stop()
    with socket.socket() as s:  # nothing listens there any more (the scrape's TIME_WAIT aside)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))


def test_port_in_use_is_one_line_with_the_fix(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(TorchwatchError, match="already in use"):
            MetricsServer(ObservationCollector(list, "h"), "127.0.0.1", port)
        code = main(["run", "--headless", "--prometheus", f"127.0.0.1:{port}", "--", "python", "-c", "pass"])
    err = capsys.readouterr().err.strip()
    assert code == 1
    assert err.count("\n") == 0 and "already in use" in err and "hint: choose another port" in err


def test_bad_prometheus_option_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--prometheus", "nope", "--", "true"]) == 2
    assert "--prometheus takes [HOST:]PORT" in capsys.readouterr().err


def test_a_rank_watched_alone_keeps_its_own_rank() -> None:
    view = RankView(
        0, 400, steps=StepsView(status="ok", pid=400, p50_ms=80.0), rank_info=RankInfo(rank=3, local_rank=1)
    )
    got = samples([Observation(t=1.0, elapsed_s=5.0, window_s=10.0, target=TargetView(400), ranks={0: view})])
    assert value(got, "torchwatch_step_time_seconds", rank="3", local_rank="1") == pytest.approx(0.08)


def test_a_rank_that_stopped_stepping_keeps_its_labels_in_the_hang_state() -> None:
    """Ranks without steps in the window leave the Observation's ranks; the hang that names them
    still carries the labels they were exported with (held by the collector, one scrape to the next)."""
    current = [two_ranks()]
    collector = ObservationCollector(lambda: list(current), "node1")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    generate_latest(registry)  # both ranks stepping: their labels are seen
    rows = (HangProcess(201, "rank", 0, None, "backward"), HangProcess(202, "rank", 1, None, "elsewhere"))
    hang = HangView("hang", 202, 1, 5.0, "--hang-after", 40.0, 45.9, 5.9, 7.5, processes=rows)
    only_focus = {0: dataclasses.replace(two_ranks().ranks[0], reading=None)}
    current[:] = [dataclasses.replace(two_ranks(), ranks=only_focus, hang=hang)]
    got: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            got[(s.name, frozenset(s.labels.items()))] = s.value
    full = {"training_job": JOB, "host": "node1", "rank": "1", "local_rank": "1", "world_size": "2"}
    assert value(got, "torchwatch_rank_hang_state", state="elsewhere", **full) == 1
    assert value(got, "torchwatch_rank_hang", **full) == 1  # its clock ran out, though it left the ranks
    assert value(got, "torchwatch_stall_seconds", state="hang", **full) == pytest.approx(7.5)
    assert value(got, "torchwatch_rank_hang", rank="0") == 0
    current[:] = []
    generate_latest(registry)
    assert collector._seen == {}  # a training no longer watched leaves nothing behind


# -- job identity: what the kernel says of the owner, not what the environment claims ----------------------
def _claiming(pid: int, job: str) -> Observation:
    """Another training (PID ``pid``, ranks 301/302) whose hooks publish the job key ``job``."""
    base = two_ranks()
    ranks = {
        r: dataclasses.replace(
            v,
            pid=301 + r,
            rank_info=dataclasses.replace(v.rank_info, job=job) if v.rank_info is not None else None,
        )
        for r, v in base.ranks.items()
    }
    return dataclasses.replace(base, target=TargetView(pid), ranks=ranks, processes=())


def test_another_users_claim_of_a_job_key_is_refused_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    """Issue 49: TORCHWATCH_JOB of another user's job joined that job in every rule, and a
    ``pid:`` key copied another training's label set and shadowed its series (first wins)."""
    mine, other = Origin(1000, "", ""), Origin(1001, "", "")
    for claim in (JOB, "pid:100"):
        caplog.clear()
        obs = [two_ranks(), _claiming(400, claim)]
        collector = ObservationCollector(lambda obs=obs: obs, "node1", lambda: {100: mine, 400: other})
        for _ in range(2):  # said once, not at every scrape
            list(collector.collect())
        said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert len(said) == 1 and f"job key {claim!r}: refused" in said[0] and "PID 400" in said[0], said
        got = samples(obs, {100: mine, 400: other})
        # the real job keeps its key and its series; the claim is exported under its own pid: key
        assert value(got, "torchwatch_data_wait_seconds", rank="1", training_job=JOB) == pytest.approx(0.09)
        assert value(got, "torchwatch_steps_total", rank="1", training_job=JOB, uid="1000") == 121
        assert value(got, "torchwatch_steps_total", rank="1", training_job="pid:400", uid="1001") == 121
        assert not [k for k in got if ("training_job", claim) in k[1] and ("uid", "1001") in k[1]]


def test_ranks_of_one_user_in_two_containers_share_their_job_key() -> None:
    got = samples([two_ranks(), _claiming(400, JOB)], {100: OWNER, 400: Origin(1000, "9a8b7c6d5e4f", "")})
    keys = {dict(k[1])["container_id"]: dict(k[1])["training_job"] for k in got if k[0] == "torchwatch_steps_total"}
    assert keys == {"4f3c2a1b0e9d": JOB, "9a8b7c6d5e4f": JOB}


def test_job_keys_refuse_a_pid_key_and_a_collision_in_the_order_given() -> None:
    keys, refused = job_keys(
        [two_ranks(), _claiming(400, JOB), _claiming(500, "pid:7"), _claiming(600, "pid:600")],
        {100: Origin(1000), 400: Origin(0), 500: Origin(1000), 600: Origin(1000)},
    )
    assert keys == {100: JOB, 400: "pid:400", 500: "pid:500", 600: "pid:600"}
    assert [(pid, key) for pid, key, _ in refused] == [(400, JOB), (500, "pid:7")]
