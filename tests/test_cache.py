"""The compile cache: warm starts compile nothing, keys name what changes the output,
corrupted entries are recompiled, eviction, concurrent processes, and the shared
Redis cache with its HMAC-signed entries (a real redis-server on loopback)."""

import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch

import tori
from tori.cache import REDIS_PREFIX, CorruptEntry, DiskCache, compile_key, decode_entry, encode_entry, host_cpu
from tori.config import Options, from_environment
from tori.errors import OptionsError
from tori.targets import Target
from tori.testing import assert_matches_eager, cache_entries, count_graphs, free_port

from system_packages import missing

ROOT = Path(__file__).resolve().parent.parent

# A fresh process compiles the MLP benchmark model and prints its counters and whether
# the result matched eager.
CHILD = textwrap.dedent("""
    import json, sys
    import torch
    sys.path.insert(0, sys.argv[1])
    from models import MODELS
    from tori.stats import counters
    import tori.frontend.backend as backend
    traced, aot_autograd = [], backend.aot_autograd
    backend.aot_autograd = lambda **kwargs: traced.append(1) or aot_autograd(**kwargs)
    model = MODELS["mlp"]
    module, inputs = model.build(), model.example_inputs()
    with torch.no_grad():
        expected = module(*inputs)
        actual = torch.compile(module, backend="tori", options={"fallback": "error"})(*inputs)
    torch.testing.assert_close(actual, expected)
    print(json.dumps({"iree_compiles": counters.iree_compiles, "cache_hits": counters.cache_hits,
                      "compiled_graphs": counters.compiled_graphs, "cache_corrupt": counters.cache_corrupt,
                      "cache_refused": counters.cache_refused, "graph_cache_hits": counters.graph_cache_hits,
                      "aot_traces": len(traced)}))
""")


def run_child(cache_dir: Path, **env: str) -> dict:
    environ = {**os.environ, "TORI_CACHE_DIR": str(cache_dir), **env}
    done = subprocess.run([sys.executable, "-c", CHILD, str(ROOT / "benchmarks")], env=environ,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def entries(cache_dir: Path) -> list[Path]:
    return cache_entries(cache_dir)


def test_warm_start_in_a_new_process_compiles_nothing(tmp_path):
    cold = run_child(tmp_path)
    assert cold["iree_compiles"] == 1 and cold["cache_hits"] == 0 and cold["compiled_graphs"] == 1
    assert cold["aot_traces"] == 1 and cold["graph_cache_hits"] == 0
    assert len(entries(tmp_path)) == 1 and len(cache_entries(tmp_path, graphs=True)) == 1
    warm = run_child(tmp_path)
    assert warm["iree_compiles"] == 0 and warm["cache_hits"] == 1
    assert warm["compiled_graphs"] == 1  # the graph still runs compiled
    # Served by the Dynamo graph's entry: AOTAutograd did not trace it again.
    assert warm["graph_cache_hits"] == 1 and warm["aot_traces"] == 0


def test_benchmark_first_calls_time_each_stage_of_a_cold_and_a_warm_start(tmp_path):
    # `make bench`'s fresh-process first calls (benchmarks/warm_start.py) wrap tori's
    # stage functions where the pipeline calls them: a function moved breaks the run.
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import warm_start
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    cold = warm_start.run_child("mlp", "tori", str(tmp_path))
    stages = cold["stages_s"]
    assert cold["iree_compiles"] == 1 and cold["compiled_graphs"] == 1 and cold["fallback_graphs"] == 0
    assert stages["iree-compile"] > 0 and stages["import+passes"] > 0 and stages["module load"] > 0
    assert sum(stages.values()) == pytest.approx(cold["first_call_s"], rel=1e-6)
    warm = warm_start.run_child("mlp", "tori", str(tmp_path))
    assert warm["iree_compiles"] == 0 and warm["cache_hits"] == 1 and warm["stages_s"]["iree-compile"] == 0


def test_off_switch_writes_nothing_and_compiles_every_time(tmp_path):
    assert from_environment({"TORI_CACHE": "0"}).cache is False
    for _ in range(2):
        with count_graphs() as count:
            assert_matches_eager(torch.nn.Linear(8, 4), torch.randn(2, 8),
                                 options={"cache": False, "cache_dir": str(tmp_path)})
        assert count.iree_compiles == 1 and count.cache_hits == 0 and count.cache_misses == 0
    assert not entries(tmp_path)


def test_key_names_weights_target_flags_and_host_cpu(tmp_path):
    options = {"cache_dir": str(tmp_path)}
    with torch.no_grad():
        torch.manual_seed(1)
        first = torch.nn.Linear(16, 4)
        with count_graphs() as count:
            assert_matches_eager(first, torch.randn(2, 16), options=options)
            assert_matches_eager(first, torch.randn(2, 16), options=options)
        assert (count.iree_compiles, count.cache_hits) == (1, 1)
        # Weights are arguments of the module: other weights, the same module, still correct.
        with count_graphs() as count:
            assert_matches_eager(torch.nn.Linear(16, 4), torch.randn(2, 16), options=options)
        assert (count.iree_compiles, count.cache_hits) == (0, 1)
        # A constant inside the graph is part of the IR: another value, another key.
        with count_graphs() as count:
            assert_matches_eager(lambda x: x * torch.full((16,), 2.5), torch.randn(2, 16), options=options)
            assert_matches_eager(lambda x: x * torch.full((16,), 3.5), torch.randn(2, 16), options=options)
        assert (count.iree_compiles, count.cache_hits) == (2, 0)
        # Other flags, another key.
        with count_graphs() as count:
            assert_matches_eager(first, torch.randn(2, 16), options={**options, "iree_flags": "--iree-opt-level=O1"})
        assert (count.iree_compiles, count.cache_hits) == (1, 0)
    assert len(entries(tmp_path)) == 4
    ir = tori.compiler.inspect(first, torch.randn(2, 16), stages=["tori"])["tori"]
    base = Options()
    keys = {compile_key(ir, base), compile_key(ir, base.replace(cpu="znver3")),
            compile_key(ir, base.replace(targets=(Target.VULKAN,))), compile_key(ir + " ", base),
            compile_key(ir, base.replace(vulkan_target="rdna3", targets=(Target.VULKAN,)))}
    assert len(keys) == 5
    assert compile_key(ir, base) == compile_key(ir, base.replace(fallback="error", cache_dir=tmp_path))
    # "host" is keyed by the actual CPU, never by the word.
    assert host_cpu()["machine"] and (len(host_cpu()) > 1)


def test_corrupted_entry_is_detected_deleted_and_recompiled(tmp_path, caplog):
    options = {"cache_dir": str(tmp_path)}
    model, x = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh()), torch.randn(3, 8)
    assert_matches_eager(model, x, options=options)
    (entry,) = entries(tmp_path)
    good = entry.read_bytes()
    for damage in (good[:-100], good[:-5000] + bytes(4900) + good[-100:], good[:40]):
        entry.write_bytes(damage)
        with pytest.raises(CorruptEntry):
            decode_entry(entry.stem, damage)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="tori.cache"), count_graphs() as count:
            assert_matches_eager(model, x, options=options)
        assert (count.cache_corrupt, count.iree_compiles, count.cache_hits) == (1, 1, 0)
        assert len([r for r in caplog.records if "corrupted" in r.getMessage()]) == 1
        assert decode_entry(entry.stem, entry.read_bytes())  # rewritten whole


def test_least_recently_used_entries_are_evicted_past_the_bound(tmp_path):
    blob = os.urandom(40_000)
    cache = DiskCache(tmp_path, max_bytes=100_000)
    for key in ("aa01", "bb02"):
        cache.put(key, encode_entry(key, {Target.CPU: blob}))
        time.sleep(0.01)
    assert cache.get("aa01") == {Target.CPU: blob}  # now more recent than bb02
    time.sleep(0.01)
    cache.put("cc03", encode_entry("cc03", {Target.CPU: blob}))
    assert cache.get("bb02") is None
    assert cache.get("aa01") is not None and cache.get("cc03") is not None
    assert sum(p.stat().st_size for p in entries(tmp_path)) <= 100_000
    with pytest.raises(OptionsError):
        Options.from_mapping({"cache_max_bytes": "0"})
    assert Options.from_mapping({"cache_max_bytes": "512M"}).cache_max_bytes == 512 << 20
    with pytest.raises(OptionsError):
        Options.from_mapping({"cache_url": "http://cache:6379"})


# Each process writes and reads the same keys as fast as it can; a torn read would
# raise CorruptEntry (and counts cache_corrupt).
STRESS = textwrap.dedent("""
    import os, sys
    from tori.cache import DiskCache, encode_entry
    from tori.stats import counters
    from tori.targets import Target
    cache = DiskCache(sys.argv[1], max_bytes=1 << 30)
    seed = int(sys.argv[2])
    reads = 0
    for i in range(100):
        key = f"ab{i % 3}"
        cache.put(key, encode_entry(key, {Target.CPU: bytes([seed]) * (1 << 20) + os.urandom(64)}))
        reads += cache.get(f"ab{(i + 1) % 3}") is not None
    print(counters.cache_corrupt, reads)
""")


def test_concurrent_processes_never_read_a_torn_entry(tmp_path):
    writers = [subprocess.Popen([sys.executable, "-c", STRESS, str(tmp_path), str(seed)], stdout=subprocess.PIPE,
                                text=True) for seed in range(4)]
    outputs = [w.communicate(timeout=120)[0].split() for w in writers]
    assert all(w.returncode == 0 for w in writers)
    assert [int(corrupt) for corrupt, _ in outputs] == [0, 0, 0, 0]
    assert sum(int(reads) for _, reads in outputs) > 200
    assert not list(tmp_path.glob("??/*.tmp"))
    # And the real thing: two processes compiling the same model into one empty cache.
    shared = tmp_path / "shared"
    children = [subprocess.Popen([sys.executable, "-c", CHILD, str(ROOT / "benchmarks")], text=True,
                                 stdout=subprocess.PIPE, env={**os.environ, "TORI_CACHE_DIR": str(shared)})
                for _ in range(2)]
    results = [json.loads(c.communicate(timeout=300)[0].strip().splitlines()[-1]) for c in children]
    assert all(c.returncode == 0 for c in children)
    assert all(r["cache_corrupt"] == 0 and r["compiled_graphs"] == 1 for r in results)
    assert sum(r["iree_compiles"] for r in results) == 1  # one compiled, the other waited for its entry
    (entry,) = entries(shared)
    assert decode_entry(entry.stem, entry.read_bytes())


# --- the shared Redis cache ---

@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    server = shutil.which("redis-server")
    if server is None:
        missing("REDIS")
    port = free_port()
    directory = tmp_path_factory.mktemp("redis")
    process = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                                "no", "--dir", str(directory)], stdout=subprocess.DEVNULL)
    import redis

    client = redis.Redis(host="127.0.0.1", port=port)
    for _ in range(100):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    else:
        process.kill()
        pytest.fail("redis-server did not start")
    yield f"redis://127.0.0.1:{port}/0"
    process.terminate()
    process.wait(timeout=10)


def test_second_machine_with_empty_local_cache_compiles_nothing(tmp_path, redis_url):
    shared = {"TORI_CACHE_URL": redis_url, "TORI_CACHE_KEY": "fleet-secret"}
    first = run_child(tmp_path / "machine-a", **shared)
    assert first["iree_compiles"] == 1
    second = run_child(tmp_path / "machine-b", **shared)
    assert second["iree_compiles"] == 0 and second["cache_hits"] == 1 and second["compiled_graphs"] == 1
    assert len(entries(tmp_path / "machine-b")) == 1  # fetched into the local cache


def test_forged_redis_entry_is_refused(tmp_path, redis_url, monkeypatch, caplog):
    import redis

    monkeypatch.setenv("TORI_CACHE_KEY", "fleet-secret")
    options = {"cache_dir": str(tmp_path / "a"), "cache_url": redis_url}
    model, x = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()), torch.randn(3, 8)
    assert_matches_eager(model, x, options=options)
    (entry,) = entries(tmp_path / "a")
    key = entry.stem
    client = redis.Redis.from_url(redis_url)
    # The forger writes a valid entry (another model's module) without the fleet's key.
    evil = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Sigmoid())
    assert_matches_eager(evil, x, options={"cache_dir": str(tmp_path / "evil")})
    (evil_entry,) = entries(tmp_path / "evil")
    module = decode_entry(evil_entry.stem, evil_entry.read_bytes())
    forged = encode_entry(key, module)
    for signature in (b"", b"0" * 64, b"deadbeef"):
        client.set(REDIS_PREFIX + key, signature + b"\n" + forged)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="tori.cache"), count_graphs() as count:
            assert_matches_eager(model, x, options={**options, "cache_dir": str(tmp_path / f"b{len(signature)}")})
        assert (count.cache_refused, count.iree_compiles, count.cache_hits) == (1, 1, 0)
        assert len([r for r in caplog.records if "not signed" in r.getMessage()]) == 1


def test_shared_cache_needs_a_key(tmp_path, redis_url, monkeypatch):
    monkeypatch.delenv("TORI_CACHE_KEY", raising=False)
    with pytest.raises(OptionsError, match="TORI_CACHE_KEY"):
        assert_matches_eager(torch.nn.Linear(4, 4), torch.randn(2, 4),
                             options={"cache_dir": str(tmp_path), "cache_url": redis_url})


# --- one compile per graph across processes (single flight) ---

def _entry(key: str) -> bytes:
    return encode_entry(key, {Target.CPU: b"module of " + key.encode()})


def _holding(cache, key: str, put_after: float | None, ready: "threading.Event") -> "threading.Thread":
    """A thread that takes the claim on `key` (a process compiling it) and puts its
    entry after `put_after` seconds (or never)."""
    import threading

    def compile_it():
        with cache.single_flight(key, wait_s=30) as found:
            assert found is None
            ready.set()
            if put_after is not None:
                time.sleep(put_after)
                cache.put(key, {Target.CPU: b"module of " + key.encode()})
            else:
                time.sleep(1.0)
    thread = threading.Thread(target=compile_it)
    thread.start()
    assert ready.wait(10)
    return thread


def test_a_process_waits_for_the_one_compiling_and_is_served_its_entry(tmp_path):
    import threading

    from tori.cache import CompileCache

    # Two caches on one directory stand for two processes: their flock locks conflict.
    first, second = (CompileCache(DiskCache(tmp_path, 1 << 30)) for _ in range(2))
    holder = _holding(first, "ab01", put_after=0.5, ready=threading.Event())
    start = time.monotonic()
    with count_graphs() as count, second.single_flight("ab01", wait_s=30) as found:
        waited = time.monotonic() - start
    holder.join()
    assert found == {Target.CPU: b"module of ab01"} and waited >= 0.3
    assert (count.cache_hits, count.cache_waits, count.cache_misses) == (1, 1, 0)


def test_a_waiter_compiles_itself_when_its_wait_runs_out(tmp_path, caplog):
    import threading

    from tori.cache import CompileCache

    first, second = (CompileCache(DiskCache(tmp_path, 1 << 30)) for _ in range(2))
    holder = _holding(first, "ab02", put_after=None, ready=threading.Event())
    with caplog.at_level(logging.WARNING, logger="tori.cache"), count_graphs() as count, \
            second.single_flight("ab02", wait_s=0.2) as found:
        assert found is None
    holder.join()
    assert (count.cache_misses, count.cache_waits) == (1, 0)
    assert any("cache_wait_s" in r.getMessage() and "compiling it here too" in r.getMessage() for r in caplog.records)


def test_the_lock_of_a_process_that_died_is_released(tmp_path):
    from tori.cache import CompileCache

    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from tori.cache import CompileCache, DiskCache
        with CompileCache(DiskCache(Path({str(tmp_path)!r}), 1 << 30)).single_flight("ab03", wait_s=30) as found:
            print("holding", flush=True)
            time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "holding"
    holder.kill()
    holder.wait(10)
    start = time.monotonic()
    with CompileCache(DiskCache(tmp_path, 1 << 30)).single_flight("ab03", wait_s=30) as found:
        assert found is None
    assert time.monotonic() - start < 5


def test_machines_sharing_redis_wait_for_one_compile(tmp_path, redis_url, monkeypatch):
    import threading

    from tori.cache import CompileCache, RedisCache

    # Two machines: their own local directories, one Redis server.
    machines = [CompileCache(DiskCache(tmp_path / name, 1 << 30), RedisCache(redis_url, b"fleet-secret"))
                for name in ("a", "b")]
    holder = _holding(machines[0], "ab04", put_after=0.5, ready=threading.Event())
    with count_graphs() as count, machines[1].single_flight("ab04", wait_s=30) as found:
        pass
    holder.join()
    assert found == {Target.CPU: b"module of ab04"}
    assert (count.cache_hits, count.cache_waits) == (1, 1)
    assert len(entries(tmp_path / "b")) == 1


def test_two_machines_compiling_one_model_at_once_compile_it_once(tmp_path, redis_url):
    import redis

    redis.Redis.from_url(redis_url).flushdb()  # the model's entry from the tests before
    environ = {**os.environ, "TORI_CACHE_URL": redis_url, "TORI_CACHE_KEY": "fleet-secret"}
    children = [subprocess.Popen([sys.executable, "-c", CHILD, str(ROOT / "benchmarks")], text=True,
                                 stdout=subprocess.PIPE, env={**environ, "TORI_CACHE_DIR": str(tmp_path / name)})
                for name in ("a", "b")]
    results = [json.loads(c.communicate(timeout=300)[0].strip().splitlines()[-1]) for c in children]
    assert all(c.returncode == 0 for c in children)
    assert sum(r["iree_compiles"] for r in results) == 1
    assert all(r["compiled_graphs"] == 1 for r in results)


# --- stress: 4 processes, 20 graphs, one process killed mid-compile ---

# Process P compiles 8 of 20 graphs (5P to 5P+7, modulo 20: every graph in one or two
# processes, 12 of them in two), in an order of its own, each against eager.
STRESS_COMPILE = textwrap.dedent("""
    import json, random, sys
    import torch
    from tori.stats import counters
    p = int(sys.argv[1])
    graphs = [(5 * p + i) % 20 for i in range(8)]
    random.Random(p).shuffle(graphs)
    weights = torch.randn(20, 24, 24, generator=torch.Generator().manual_seed(0))
    x = torch.randn(4, 24, generator=torch.Generator().manual_seed(1))
    wrong = []
    for k in graphs:
        w = weights[k]
        def f(x):
            return torch.tanh(x @ w) * (k + 1) + x.sum(-1, keepdim=True)
        torch._dynamo.reset()
        got = torch.compile(f, backend="tori", options={"fallback": "error"})(x)
        if not torch.allclose(got, f(x), rtol=1e-4, atol=1e-5):
            wrong.append(k)
        print("done", k, flush=True)
    print(json.dumps({"wrong": wrong, "compiled_graphs": counters.compiled_graphs,
                      "fallback_graphs": counters.fallback_graphs, "iree_compiles": counters.iree_compiles,
                      "cache_hits": counters.cache_hits, "cache_corrupt": counters.cache_corrupt,
                      "cache_waits": counters.cache_waits}), flush=True)
""")
STRESS_BOUND = 200_000  # bytes: about 8 of the 20 entries, so that processes evict each other's


def _iree_compile_children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            name = stat.read_text().split("(", 1)[1].rsplit(")", 1)[0]
        except OSError:
            continue
        if int(fields[1]) == pid and name.startswith("iree-compile"):
            found.append(int(stat.parent.name))
    return found


def _stress_run(tmp_path: Path, redis_url: str | None = None) -> None:
    environ = {**os.environ, "TORI_CACHE_MAX_SIZE": str(STRESS_BOUND), "TORI_CACHE_WAIT": "120"}
    if redis_url:
        environ |= {"TORI_CACHE_URL": redis_url, "TORI_CACHE_KEY": "fleet-secret"}
    directory = lambda p: tmp_path / ("shared" if redis_url is None else f"machine-{p}")  # noqa: E731
    started = time.monotonic()
    children = [subprocess.Popen([sys.executable, "-c", STRESS_COMPILE, str(p)], text=True, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, env={**environ, "TORI_CACHE_DIR": str(directory(p))})
                for p in range(4)]
    victim = children[3]
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(victim.stdout), daemon=True)
    reader.start()
    # Killed in its third compile or later, while its iree-compile runs.
    while sum(line.startswith("done") for line in lines) < 2 or not _iree_compile_children(victim.pid):
        assert victim.poll() is None, f"process 3 ended first: {victim.stderr.read()[-2000:]}"
        time.sleep(0.01)
    victim.kill()
    victim.wait()
    reader.join(timeout=10)
    assert not any(line.startswith("{") for line in lines)  # it never finished
    results = []
    for child in children[:3]:
        out, err = child.communicate(timeout=300)
        assert child.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    elapsed = time.monotonic() - started
    for r in results:
        assert r["wrong"] == [] and r["fallback_graphs"] == 0 and r["compiled_graphs"] == 8, r
        assert r["cache_corrupt"] == 0, r
    assert elapsed < 110, f"{elapsed:.0f} s: a process waited on the killed one's lock or claim"
    folders = {directory(p) for p in range(4)}
    for folder in folders:
        cached = sorted(folder.glob("??/*.entry"))  # modules and Dynamo graphs
        for entry in cached:  # whole, never torn
            assert decode_entry(entry.stem, entry.read_bytes())
        assert sum(e.stat().st_size for e in cached) <= STRESS_BOUND
        assert folder == directory(3) or len(entries(folder)) >= 4
        assert len(list(folder.glob("??/*.tmp"))) <= (1 if folder == directory(3) else 0)
    if redis_url:
        import redis

        client = redis.Redis.from_url(redis_url)
        stored = [k for k in client.keys(REDIS_PREFIX + "*")]
        assert len(stored) >= 8
        from tori.cache import RedisCache

        shared = RedisCache(redis_url, b"fleet-secret")
        for name in stored:
            key = name.decode()[len(REDIS_PREFIX):]
            assert decode_entry(key, shared.get(key))
    # A process after them, with process 0's graphs: each served or compiled again, correct.
    out = subprocess.run([sys.executable, "-c", STRESS_COMPILE, "0"],
                         capture_output=True, text=True, timeout=300,
                         env={**environ, "TORI_CACHE_DIR": str(directory(0))})
    assert out.returncode == 0, out.stderr[-3000:]
    last = json.loads(out.stdout.strip().splitlines()[-1])
    assert last["wrong"] == [] and last["cache_corrupt"] == 0 and last["cache_hits"] >= 2, last


# Both stress runs are `make test-extended`'s (54 s): the suite has their parts apart, two
# machines compiling one model at once through Redis (once), a process killed in
# iree-compile (no entry left, tests/test_reliability.py) and one directory shared by
# concurrent processes (the torn-entry test).
@pytest.mark.extended
def test_four_processes_one_killed_mid_compile_share_one_directory(tmp_path):
    _stress_run(tmp_path)


@pytest.mark.extended
def test_four_machines_one_killed_mid_compile_share_redis(tmp_path, redis_url):
    import redis

    redis.Redis.from_url(redis_url).flushdb()
    _stress_run(tmp_path, redis_url)


@pytest.mark.extended
@pytest.mark.parametrize("shared", ["directory", "redis"])
def test_cache_stress_ten_runs_in_a_row(tmp_path, redis_url, shared):
    import redis

    for run in range(10):
        redis.Redis.from_url(redis_url).flushdb()
        _stress_run(tmp_path / f"run{run}", redis_url if shared == "redis" else None)
