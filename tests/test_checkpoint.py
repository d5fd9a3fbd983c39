"""Checkpoints: round trips across layouts and world sizes, atomicity, clear errors.

In simulation each test gets its own ``tmp_path``. Under mpiexec every rank must name the
same directory: it is derived from the test name under a per-job folder in /tmp (the ranks
of one job share their parent process), so concurrent jobs do not collide.
"""
import os
import re

import numpy as np
import pytest

import ctensor as ct
import ctensor.nn as nn
import ctensor.optim as optim
from conftest import MPI_MODE
from ctensor.checkpoint_io import pending_saves

S, B, P = ct.sbp.split, ct.sbp.broadcast, ct.sbp.partial_sum
RNG = np.random.default_rng(3)
A = RNG.standard_normal((6, 5))          # uneven on 4 ranks
V = np.arange(7, dtype=np.int64)


def barrier():
    """Every rank waits for every other (an all-gather)."""
    ct.ones(ct.world_size(), sbp=S(0)).numpy()


@pytest.fixture
def ckpt_dir(request, tmp_path):
    if not MPI_MODE:
        yield str(tmp_path)
        return
    base = os.environ.get("CTENSOR_TEST_TMP") or \
        f"/tmp/ctensor-tests-{os.getuid()}-{os.getppid()}"
    path = os.path.join(base, re.sub(r"[^A-Za-z0-9_.-]", "_", request.node.name))
    os.makedirs(path, exist_ok=True)
    barrier()
    yield path


def test_round_trip_across_world_sizes(world4, ckpt_dir):
    mesh = ct.placement("cpu", [[0, 1], [2, 3]])
    x = ct.tensor(A, placement=mesh, sbp=(S(0), S(1)))
    y = ct.tensor(V, placement=mesh, sbp=(B, S(0)))
    z = ct.tensor(A, placement=mesh, sbp=(P, S(0)))       # partial: reduced when saved
    path = os.path.join(ckpt_dir, "ck")
    ct.save({"x": x, "nested": {"y": y, "z": z}, "step": 5}, path)
    back = ct.load(path)
    assert back["step"] == 5
    np.testing.assert_array_equal(back["x"].numpy(), A)
    assert back["x"].placement == ct.placement.all() and back["x"].sbp == (B,)
    assert back["nested"]["y"].dtype == np.int64
    for size, sbp in [(2, S(1)), (1, B), (3, S(0))]:
        with ct.simulate(size):
            mesh2 = ct.placement("cpu", list(range(size)))
            got = ct.load(path, placement=mesh2, map={"x": sbp, "nested.z": sbp})
            for key, arr in [("x", got["x"]), ("z", got["nested"]["z"])]:
                np.testing.assert_array_equal(arr.numpy(), A, err_msg=key)
                assert arr.sbp == (sbp,)
                for r, shard in arr.local_shards().items():
                    box = arr._layout.region(r)
                    np.testing.assert_array_equal(
                        shard, A[tuple(slice(a, b) for a, b in box)])
            np.testing.assert_array_equal(got["nested"]["y"].numpy(), V)


@pytest.mark.skipif(MPI_MODE, reason="saving from several simulated worlds needs one process")
def test_saved_in_small_world_loaded_in_large(tmp_path):
    path = str(tmp_path / "ck")
    with ct.simulate(2):
        ct.save({"x": ct.tensor(A, placement=ct.placement("cpu", [0, 1]), sbp=S(1))}, path)
    with ct.simulate(4):
        mesh = ct.placement("cpu", [[0, 1], [2, 3]])
        got = ct.load(path, placement=mesh, sbp=(S(1), S(0)))["x"]
        np.testing.assert_array_equal(got.numpy(), A)
        assert got.sbp == (S(1), S(0))


def test_tree_of_values_and_map(mesh, ckpt_dir):
    obj = {"a": [1, 2.5, "s", None, True], "t": (3, {"k": "v"}), 7: {"int key": 1},
           "arr": np.arange(6.0).reshape(2, 3),
           "w": ct.tensor(A, placement=mesh, sbp=(S(0),) * mesh.ndim),
           "e": ct.tensor(np.zeros((0, 3)), placement=mesh, sbp=(S(0),) * mesh.ndim),
           "s": ct.tensor(np.float64(2.5), placement=mesh)}
    path = os.path.join(ckpt_dir, "tree")
    ct.save(obj, path)
    got = ct.load(path, map={"w": S(1)})
    assert got["a"] == [1, 2.5, "s", None, True]
    assert got["t"] == (3, {"k": "v"}) and got[7] == {"int key": 1}
    np.testing.assert_array_equal(got["arr"], obj["arr"])
    assert got["w"].sbp == (S(1),) and got["e"].shape == (0, 3)
    np.testing.assert_array_equal(got["w"].numpy(), A)
    assert float(got["s"]) == 2.5
    # a function choosing per tensor (name, shape, dtype) -> (placement, sbp)
    sub = ct.placement("cpu", [0])
    got = ct.load(path, map=lambda name, shape, dtype: (sub, B) if name == "w" else None)
    assert got["w"].placement == sub
    np.testing.assert_array_equal(got["w"].numpy(), A)


def test_model_and_optimizer_resume_in_another_layout(mesh, ckpt_dir):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(ct.tensor(A))
            self.b = nn.Parameter(ct.tensor(A[0]))

        def forward(self, x):
            return ((x * self.w + self.b) ** 2).mean()

    def train(model, opt, steps):
        x = ct.tensor(np.linspace(-1, 1, 30).reshape(6, 5), placement=model.w.placement)
        for _ in range(steps):
            opt.zero_grad()
            model(x).backward()
            opt.step()

    split = (S(0),) * mesh.ndim
    model = Net().to_global(mesh, {"w": split})
    opt = optim.AdamW(model.parameters(), lr=0.05)
    train(model, opt, 2)
    path = os.path.join(ckpt_dir, "resume")
    ct.save({"model": model.state_dict(), "optim": opt.state_dict(), "step": 2}, path)
    train(model, opt, 2)
    state = ct.load(path)
    other = Net().to_global(mesh, {"b": split})      # another layout, fresh values
    opt2 = optim.AdamW(other.parameters(), lr=0.05, shard_states_along=0)
    other.load_state_dict(state["model"])
    opt2.load_state_dict(state["optim"])
    assert other.b.sbp == split and other.w.sbp == (B,) * mesh.ndim
    train(other, opt2, 2)
    np.testing.assert_allclose(other.w.numpy(), model.w.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(other.b.numpy(), model.b.numpy(), rtol=1e-12, atol=1e-12)


def test_overwrite_is_atomic_and_leftovers_are_ignored(ckpt_dir):
    path = os.path.join(ckpt_dir, "over")
    ct.save({"x": ct.tensor(A)}, path)
    if ct.rank() == 0:  # a crashed earlier save left its temporary directory behind
        os.makedirs(path + ".ctensor-tmp", exist_ok=True)
        with open(os.path.join(path + ".ctensor-tmp", "junk"), "w") as f:
            f.write("x")
    barrier()
    ct.save({"x": ct.tensor(2 * A), "y": 1}, path)
    got = ct.load(path)
    np.testing.assert_array_equal(got["x"].numpy(), 2 * A)
    assert got["y"] == 1
    assert not os.path.exists(path + ".ctensor-tmp")
    assert sorted(f for f in os.listdir(path) if not f.endswith(".npy")) == \
        ["COMPLETE", "metadata.json"]


def test_a_save_stopped_between_its_renames_loads_the_old_checkpoint(ckpt_dir):
    # the commit renames path -> path.ctensor-old, then the new one into path: killed
    # between the two, path is missing and the old checkpoint is where it was moved
    path = os.path.join(ckpt_dir, "between")
    ct.save({"x": ct.tensor(A)}, path)
    barrier()
    if ct.rank() == 0:
        os.rename(path, path + ".ctensor-old")
        os.makedirs(path + ".ctensor-tmp")  # the new one, not yet in place
    barrier()
    np.testing.assert_array_equal(ct.load(path)["x"].numpy(), A)
    barrier()
    ct.save({"x": ct.tensor(3 * A)}, path)  # the next save completes the replacement
    np.testing.assert_array_equal(ct.load(path)["x"].numpy(), 3 * A)
    assert not os.path.exists(path + ".ctensor-old")


def test_missing_and_incomplete_checkpoints(ckpt_dir):
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        ct.load(os.path.join(ckpt_dir, "nothing-here"))
    path = os.path.join(ckpt_dir, "incomplete")
    ct.save({"x": ct.tensor(A)}, path)
    barrier()
    if ct.rank() == 0:
        os.remove(os.path.join(path, "COMPLETE"))
    barrier()
    with pytest.raises(ValueError, match="not a complete"):
        ct.load(path)


@pytest.mark.parametrize("damage", ["truncate", "metadata", "remove", "reshape"])
def test_corrupt_checkpoint_is_a_clear_error(ckpt_dir, damage):
    path = os.path.join(ckpt_dir, f"corrupt-{damage}")
    x = ct.tensor(A, sbp=S(0)) if ct.world_size() > 1 else ct.tensor(A)
    ct.save({"x": x}, path)
    barrier()
    if ct.rank() == 0:
        shard = os.path.join(path, "t0_r0.npy")
        if damage == "truncate":
            data = open(shard, "rb").read()
            open(shard, "wb").write(data[: len(data) // 2])
        elif damage == "metadata":
            open(os.path.join(path, "metadata.json"), "w").write("{not json")
        elif damage == "remove":
            os.remove(shard)
        else:
            np.save(shard, np.zeros((1, 1)))
    barrier()
    with pytest.raises(ValueError, match="corrupt"):
        ct.load(path)


def test_failed_load_leaves_the_model_unchanged(ckpt_dir):
    model = nn.Sequential()
    model.w = nn.Parameter(ct.tensor(A))
    model.b = nn.Parameter(ct.tensor(A[0]))
    path = os.path.join(ckpt_dir, "partial-model")
    ct.save({"w": ct.tensor(A + 1), "b": ct.tensor(np.zeros(3))}, path)
    state = ct.load(path)
    with pytest.raises(ValueError, match="shape"):
        model.load_state_dict(state)
    np.testing.assert_array_equal(model.w.numpy(), A)   # w was valid, but nothing moved
    with pytest.raises(ValueError, match="missing keys"):
        model.load_state_dict({"w": state["w"]})


def test_save_errors(ckpt_dir):
    with pytest.raises(TypeError, match="cannot save"):
        ct.save({"f": object()}, os.path.join(ckpt_dir, "bad"))
    with pytest.raises(TypeError, match="keys"):
        ct.save({(1, 2): 1}, os.path.join(ckpt_dir, "bad"))
    other = os.path.join(ckpt_dir, "not-a-checkpoint")
    if ct.rank() == 0:
        os.makedirs(other, exist_ok=True)
        open(os.path.join(other, "precious.txt"), "w").write("keep me")
    barrier()
    with pytest.raises(ValueError, match="not a ctensor checkpoint"):
        ct.save({"x": 1}, other)
    assert os.path.exists(os.path.join(other, "precious.txt"))
    with pytest.raises(TypeError, match="path"):
        ct.load(3)


# ----------------------------------------------------------------------------- checksums
def _flip(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x01]))  # one bit: the smallest damage


def test_every_flipped_byte_is_detected(ckpt_dir):
    """A bit flipped anywhere in any file (first byte, a byte inside, the last; .npy headers
    too) makes every load raise on every rank, naming the file (and tensor and region)."""
    n = ct.world_size()
    path = os.path.join(ckpt_dir, "flips")
    x = ct.tensor(A, sbp=S(0)) if n > 1 else ct.tensor(A)
    obj = {"x": x, "y": ct.tensor(V), "arr": np.arange(4.0), "step": 3}
    ct.save(obj, path)
    barrier()
    names = sorted(os.listdir(path))
    assert "COMPLETE" in names and "metadata.json" in names and "a0.npy" in names
    assert sum(f.startswith("t0_") for f in names) == min(n, len(A))
    pick = np.random.default_rng(7)
    for name in names:
        size = os.path.getsize(os.path.join(path, name))
        for offset in sorted({0, int(pick.integers(1, size - 1)), size - 1}):
            if ct.rank() == 0:
                _flip(os.path.join(path, name), offset)
            barrier()
            for kwargs in ({}, {"map": {"x": S(0)}}):  # every rank reads all, or its part
                with pytest.raises(ValueError, match=re.escape(name)) as info:
                    ct.load(path, **kwargs)
                if name.endswith(".npy") or name == "metadata.json":
                    assert isinstance(info.value, ct.ChecksumError), (name, offset)
                if name.startswith("t0_"):
                    assert "tensor 'x'" in str(info.value) and "region [" in str(info.value)
            barrier()
            if ct.rank() == 0:
                _flip(os.path.join(path, name), offset)  # undo
            barrier()
    got = ct.load(path)
    np.testing.assert_array_equal(got["x"].numpy(), A)
    np.testing.assert_array_equal(got["arr"], obj["arr"])


def test_version_1_checkpoint_loads_with_a_warning(ckpt_dir):
    """Checkpoints written before the checksums (format 1) still load, with a warning."""
    import json
    path = os.path.join(ckpt_dir, "v1")
    ct.save({"x": ct.tensor(A), "arr": np.arange(3)}, path)
    barrier()
    if ct.rank() == 0:
        meta = json.load(open(os.path.join(path, "metadata.json")))
        meta["version"] = 1
        checksum = meta.pop("checksum")
        for entry in meta["arrays"] + [r for t in meta["tensors"] for r in t["regions"]]:
            del entry[checksum]
        open(os.path.join(path, "metadata.json"), "w").write(json.dumps(meta))
        open(os.path.join(path, "COMPLETE"), "w").write("ctensor-checkpoint 1\n")
    barrier()
    with pytest.warns(UserWarning, match="without checksums"):
        got = ct.load(path)
    np.testing.assert_array_equal(got["x"].numpy(), A)
    np.testing.assert_array_equal(got["arr"], np.arange(3))


def test_version_2_checkpoint_with_crc32_loads_and_verifies(ckpt_dir):
    """Checkpoints of format 2 (data files checksummed with CRC-32) load and are verified
    with CRC-32; this version writes XXH3-64 (format 3)."""
    import json
    import zlib
    path = os.path.join(ckpt_dir, "v2")
    ct.save({"x": ct.tensor(A), "arr": np.arange(3)}, path)
    barrier()
    meta = json.load(open(os.path.join(path, "metadata.json")))
    assert (meta["version"], meta["checksum"]) == (3, "xxh3_64")
    barrier()
    if ct.rank() == 0:
        meta["version"], meta["checksum"] = 2, "crc32"
        for entry in meta["arrays"] + [r for t in meta["tensors"] for r in t["regions"]]:
            del entry["xxh3_64"]
            entry["crc32"] = zlib.crc32(open(os.path.join(path, entry["file"]), "rb").read())
        text = json.dumps(meta).encode()
        open(os.path.join(path, "metadata.json"), "wb").write(text)
        open(os.path.join(path, "COMPLETE"), "w").write(
            f"ctensor-checkpoint 2 crc32 {zlib.crc32(text):08x}\n")
    barrier()
    got = ct.load(path)
    np.testing.assert_array_equal(got["x"].numpy(), A)
    barrier()
    name = meta["tensors"][0]["regions"][0]["file"]
    if ct.rank() == 0:
        _flip(os.path.join(path, name), os.path.getsize(os.path.join(path, name)) - 1)
    barrier()
    with pytest.raises(ct.ChecksumError, match="crc32 checksum"):
        ct.load(path)


@pytest.mark.parametrize("direct", [True, False], ids=["direct-io", "page-cache"])
def test_large_files_direct_io_and_page_cache(ckpt_dir, monkeypatch, direct):
    """Files of 1 MiB or more are written with O_DIRECT where the file system allows it
    (header padded to a page, so the data starts on one) or through the page cache
    (``CTENSOR_DIRECT_IO=0``); either way NumPy reads them, and a synchronous save (a
    bounce buffer) and an asynchronous one (page-aligned staging buffers) hold the same
    bytes."""
    from ctensor import checkpoint_io
    monkeypatch.setattr(checkpoint_io, "_direct_ok", [direct and checkpoint_io._direct_ok[0]])
    big = RNG.standard_normal((301, 517))   # 1.2 MB, no multiple of a page
    x = ct.tensor(big)
    paths = [os.path.join(ckpt_dir, f"big-{direct}-{kind}") for kind in ("sync", "async")]
    ct.save({"x": x, "arr": big}, paths[0])
    ct.save({"x": x, "arr": big}, paths[1], async_op=True).wait()
    barrier()
    for path in paths:
        for name in ("t0_r0.npy", "a0.npy"):
            arr = np.load(os.path.join(path, name), mmap_mode="r")
            assert arr.offset % 4096 == 0
            np.testing.assert_array_equal(arr, big)
        got = ct.load(path)
        np.testing.assert_array_equal(got["x"].numpy(), big)
        np.testing.assert_array_equal(got["arr"], big)
    assert checkpoint_io.aligned_empty((3, 5), np.float32).ctypes.data % 4096 == 0


# ----------------------------------------------------------------------------- async save
@pytest.fixture
def slow_disk(monkeypatch):
    """Holds every background write until ``release()`` (as a slow disk would), so a test
    can change the saved arrays while their save is in flight."""
    import threading

    from ctensor import checkpoint_io
    gate = threading.Event()
    real = checkpoint_io.write_array

    def gated(path, arr, sync=True):
        if threading.current_thread() is not threading.main_thread():
            assert gate.wait(30), "the test never released the writes"
        return real(path, arr, sync)

    monkeypatch.setattr(checkpoint_io, "write_array", gated)
    yield gate.set
    gate.set()


def _model_and_optimizer(mesh):
    w = nn.Parameter(ct.tensor(A, placement=mesh, sbp=(S(0),) * mesh.ndim))
    opt = optim.AdamW([w], lr=0.1)
    return w, opt


def _train_step(w, opt):
    opt.zero_grad()
    (w * w).sum().backward()
    opt.step()                      # updates w and the optimizer's states in place


def test_async_save_races_the_next_step(mesh, ckpt_dir, slow_disk):
    """The shards are copied in the call: optimizer steps run while the writes wait, and
    the checkpoint holds the values of the moment of the save."""
    w, opt = _model_and_optimizer(mesh)
    _train_step(w, opt)
    state = {"w": w, "optim": opt.state_dict(), "arr": np.arange(3.0)}
    expected_w = w.numpy().copy()
    expected_avg = opt.state_dict()["state"][0]["exp_avg"].numpy().copy()
    path = os.path.join(ckpt_dir, "async")
    handle = ct.save(state, path, async_op=True)
    assert isinstance(handle, ct.SaveHandle)
    assert handle.done() is (ct.rank() not in mesh.rank_list)  # a rank with no shard: done
    state["arr"][:] = -1            # the arrays of the tree are copied too
    for _ in range(2):
        _train_step(w, opt)
    assert not np.array_equal(w.numpy(), expected_w)
    assert not os.path.exists(path)  # nothing is committed before wait()
    slow_disk()
    handle.wait()
    assert handle.done()
    handle.wait()                    # a second wait returns at once
    got = ct.load(path)
    np.testing.assert_array_equal(got["w"].numpy(), expected_w)
    np.testing.assert_array_equal(got["optim"]["state"][0]["exp_avg"].numpy(), expected_avg)
    np.testing.assert_array_equal(got["arr"], np.arange(3.0))


def test_two_saves_in_flight(mesh, ckpt_dir, slow_disk):
    w, opt = _model_and_optimizer(mesh)
    first, second = os.path.join(ckpt_dir, "one"), os.path.join(ckpt_dir, "two")
    h1 = ct.save({"w": w, "step": 1}, first, async_op=True)
    v1 = w.numpy().copy()
    _train_step(w, opt)
    h2 = ct.save({"w": w, "step": 2}, second, async_op=True)
    v2 = w.numpy().copy()
    _train_step(w, opt)
    assert pending_saves() == [h1, h2]
    slow_disk()
    h2.wait()                        # in any order, the same on every rank
    h1.wait()
    assert pending_saves() == []
    for p, value, step in [(first, v1, 1), (second, v2, 2)]:
        got = ct.load(p)
        assert got["step"] == step
        np.testing.assert_array_equal(got["w"].numpy(), value)


def test_async_save_to_a_path_in_flight_finishes_the_first(ckpt_dir):
    path = os.path.join(ckpt_dir, "same")
    h1 = ct.save({"x": ct.tensor(A), "step": 1}, path, async_op=True)
    h2 = ct.save({"x": ct.tensor(2 * A), "step": 2}, path, async_op=True)
    assert h1.done() and "committed" in repr(h1)
    h2.wait()
    got = ct.load(path)
    assert got["step"] == 2
    np.testing.assert_array_equal(got["x"].numpy(), 2 * A)


def test_async_write_error_is_raised_by_wait_on_every_rank(ckpt_dir, monkeypatch):
    from ctensor import checkpoint_io
    path = os.path.join(ckpt_dir, "failing")
    ct.save({"x": ct.tensor(A)}, path)
    real = checkpoint_io.write_array
    last = ct.world_size() - 1

    def failing(p, arr, sync=True):
        if ct.rank() == last and "ctensor-tmp" in p:
            raise OSError(28, "No space left on device")
        return real(p, arr, sync)

    monkeypatch.setattr(checkpoint_io, "write_array", failing)
    x = ct.tensor(2 * A, sbp=S(0)) if ct.world_size() > 1 else ct.tensor(2 * A)
    handle = ct.save({"x": x}, path, async_op=True)
    for _ in range(2):               # raised again by a second wait
        with pytest.raises((OSError, ValueError), match="No space left|failed on rank"):
            handle.wait()
    monkeypatch.setattr(checkpoint_io, "write_array", real)
    np.testing.assert_array_equal(ct.load(path)["x"].numpy(), A)   # the old one is intact
    assert not os.path.exists(path + ".ctensor-tmp")


@pytest.mark.skipif(MPI_MODE, reason="starts a Python process of its own")
def test_pending_saves_are_finished_or_reported_at_exit(tmp_path):
    import subprocess
    import sys
    script = tmp_path / "script.py"
    script.write_text(f"""
import sys
import numpy as np
import ctensor as ct
from ctensor import checkpoint_io
with ct.simulate(2):
    x = ct.tensor(np.arange(6.0), sbp=ct.sbp.split(0))
    ct.save({{"x": x}}, {str(tmp_path / "kept")!r}, async_op=True)
    real = checkpoint_io.write_array
    def broken(path, arr, sync=True):
        if "lost" in path:
            raise OSError(5, "Input/output error")
        return real(path, arr, sync)
    checkpoint_io.write_array = broken
    ct.save({{"x": x}}, {str(tmp_path / "lost")!r}, async_op=True)
""")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI", "OMPI", "PMIX"))}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert "asynchronous save to" in done.stderr and "Input/output error" in done.stderr
    assert not os.path.exists(tmp_path / "lost")
    np.testing.assert_array_equal(ct.load(str(tmp_path / "kept"))["x"].numpy(), np.arange(6.0))


def test_load_accepts_pytorch_keywords(ckpt_dir):
    path = os.path.join(ckpt_dir, "keywords")
    ct.save({"x": ct.tensor(A)}, path)
    for kwargs in ({"map_location": "cpu"}, {"weights_only": True},
                   {"map_location": "cpu", "weights_only": False}):
        got = ct.load(path, **kwargs)
        assert got["x"].placement.device == "cpu"
        np.testing.assert_array_equal(got["x"].numpy(), A)
    torch = pytest.importorskip("torch")
    assert ct.load(path, map_location=torch.device("cpu"))["x"].placement.device == "cpu"
    with pytest.raises(TypeError, match="map_location"):
        ct.load(path, map_location=lambda storage, location: storage)
    with pytest.raises(TypeError, match="weights_only"):
        ct.load(path, weights_only="yes")
    with pytest.raises(TypeError, match="async_op"):
        ct.save({"x": 1}, path, async_op=1)
    with pytest.raises(TypeError, match="pickling"):
        ct.save({"x": np.array([object()])}, path)


def test_poll_commits_once_every_rank_has_written(ckpt_dir, slow_disk):
    import time
    path = os.path.join(ckpt_dir, "polled")
    handle = ct.save({"x": ct.tensor(A), "arr": np.arange(2)}, path, async_op=True)
    assert handle.poll() is False and not os.path.exists(path)   # rank 0's writes wait
    slow_disk()
    deadline = time.monotonic() + 30
    while not handle.poll():         # the same answer on every rank, so the same loop
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert pending_saves() == [] and handle.poll() is True
    np.testing.assert_array_equal(ct.load(path)["x"].numpy(), A)


def test_commit_runs_on_rank_0s_thread_while_poll_returns(ckpt_dir, monkeypatch):
    """The commit's file work (metadata, marker, renames, removing the replaced checkpoint)
    runs on rank 0's thread: poll() returns while it is held; wait() finishes it."""
    import threading
    import time

    from ctensor import checkpoint
    gate = threading.Event()
    real = checkpoint._Commit.write

    def gated(self, checksums):
        assert threading.current_thread() is not threading.main_thread()
        assert gate.wait(30), "the test never released the commit"
        real(self, checksums)

    path = os.path.join(ckpt_dir, "threaded")
    ct.save({"x": ct.tensor(A)}, path)  # (a synchronous save commits on the calling thread)
    monkeypatch.setattr(checkpoint._Commit, "write", gated)
    handle = ct.save({"x": ct.tensor(2 * A)}, path, async_op=True)
    deadline = time.monotonic() + 30
    while not handle.done():         # local: this process's writes
        assert time.monotonic() < deadline
        time.sleep(0.01)
    barrier()                        # every rank's writes are done
    assert handle.poll() is False    # the commit starts on rank 0's thread ...
    assert handle.poll() is False and "committing" in repr(handle)  # ... and is held there
    np.testing.assert_array_equal(ct.load(path)["x"].numpy(), A)     # the old one meanwhile
    gate.set()
    handle.wait()
    assert pending_saves() == [] and handle.poll() is True
    np.testing.assert_array_equal(ct.load(path)["x"].numpy(), 2 * A)


def test_failed_commit_is_raised_on_every_rank(ckpt_dir, monkeypatch):
    from ctensor import checkpoint
    path = os.path.join(ckpt_dir, "commit-fails")
    ct.save({"x": ct.tensor(A)}, path)

    def failing(self, checksums):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint._Commit, "write", failing)
    handle = ct.save({"x": ct.tensor(2 * A)}, path, async_op=True)
    for _ in range(2):               # raised again by a second wait
        with pytest.raises((OSError, ValueError), match="No space left"):
            handle.wait()
    assert pending_saves() == []
    monkeypatch.undo()
    np.testing.assert_array_equal(ct.load(path)["x"].numpy(), A)   # the old one is intact
    assert not os.path.exists(path + ".ctensor-tmp")
