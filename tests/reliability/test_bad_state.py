"""Bad checkpoint state: refused with a clear error before anything is produced.

After a refused ``set_state`` the iterator is where it was and keeps working. A
fuzzer feeds random bytes and mutated valid states: only ``InvalidStateError`` (a
ValueError) and ``TypeError`` may escape.
"""

import functools
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import grainlike as grain
from grainlike.loader.legacy_state import InvalidStateError, Positions
from tests.reliability.transforms import Plus

N = 30
WORKERS = [0, 2]



def _loader(workers=0, n=N, seed=3, source=None, shard=(0, 1), epochs=2, loader_shard=None):
    sampler = grain.IndexSampler(
        n, grain.ShardOptions(*shard), shuffle=True, num_epochs=epochs, seed=seed
    )
    return grain.DataLoader(
        data_source=list(range(n)) if source is None else source,
        sampler=sampler,
        operations=[Plus()],
        worker_count=workers,
        shard_options=None if loader_shard is None else grain.ShardOptions(*loader_shard),
    )


def _edit(state: bytes, **changes) -> bytes:
    data = json.loads(state)
    for key, value in changes.items():
        if key.startswith("seen_"):
            data["last_seen_indices"][key[5:]] = value
        else:
            data[key] = value
    return json.dumps(data).encode()


def _assert_refused(it, state, match, expected_next, error=InvalidStateError):
    """``set_state(state)`` is refused; nothing started; the iterator goes on as before."""
    stream_before = it._stream
    with pytest.raises(error, match=match):
        it.set_state(state)
    assert it._stream is stream_before  # no worker was started or stopped
    assert next(it) == expected_next


@pytest.fixture(params=WORKERS, ids=lambda w: f"workers{w}")
def setup(request):
    """A loader, its full output, and a valid state after 5 elements."""
    workers = request.param
    loader = _loader(workers)
    with iter(loader) as it:
        full = list(it)
    with iter(loader) as it:
        for _ in range(5):
            next(it)
        state = it.get_state()
    return workers, loader, full, state


@pytest.mark.timeout(30)
def test_malformed_state_bytes_are_refused(no_leaks, setup):
    workers, loader, full, state = setup
    cases = [
        (state[: len(state) // 2], "not valid JSON"),
        (state[:1], "not valid JSON"),
        (b"", "not valid JSON"),
        (b"\xff\xfe\x00garbage", "not UTF-8"),
        (b"[1, 2, 3]", "must be a JSON object"),
        (b'{"version": 2}', "missing the field"),
        (b'{"version": ' + b"9" * 5000 + b"}", "not valid JSON"),  # past int()'s digit limit
        (b"[" * 100000, "not valid JSON"),
    ]
    with iter(loader) as it:
        # Before the first next(): nothing starts for a refused state.
        with pytest.raises(InvalidStateError):
            it.set_state(state[:10])
        assert it._stream is None
        for k, (bad, match) in enumerate(cases):
            _assert_refused(it, bad, match, full[k])
        assert list(it) == full[len(cases):]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("bad", [None, 5, 1.5, ["x"], {"a": 1}, object()])
def test_state_that_is_not_bytes_is_a_type_error(no_leaks, bad):
    loader = _loader(0)
    with iter(loader) as it:
        head = [next(it) for _ in range(3)]
        _assert_refused(it, bad, "expects the bytes returned by get_state", list(loader)[3], TypeError)
    assert head == list(loader)[:3]


def _other_pipeline_cases(workers):
    return {
        "sampler": (_loader(workers, seed=4), "Sampler in checkpoint does not match"),
        "num_records": (_loader(workers, n=N + 1), "Sampler in checkpoint does not match"),
        "source": (
            _loader(workers, source=grain.RangeDataSource(0, N, 1)),
            "DataSource in checkpoint does not match",
        ),
        "shard": (_loader(workers, shard=(1, 2)), "Sampler in checkpoint does not match"),
    }


@pytest.mark.timeout(30)
# Another worker count is not another pipeline: the state restores elastically
# (tests/elastic/).
@pytest.mark.parametrize("other", ["sampler", "num_records", "source", "shard"])
def test_state_of_another_pipeline_is_refused(no_leaks, setup, other):
    workers, _, _, state = setup
    loader, match = _other_pipeline_cases(workers)[other]
    expected = list(loader)
    with iter(loader) as it:
        _assert_refused(it, state, match, expected[0])
        assert list(it) == expected[1:]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("workers", WORKERS)
def test_state_of_another_shard_with_the_same_sampler_is_refused(no_leaks, workers):
    # The loader's shard_options override the sampler's: only the indices tell.
    shard0 = _loader(workers, shard=(0, 2), loader_shard=(0, 2))
    shard1 = _loader(workers, shard=(0, 2), loader_shard=(1, 2))
    with iter(shard0) as it:
        next(it)
        state = it.get_state()
    expected = list(shard1)
    with iter(shard1) as it:
        _assert_refused(it, state, r"is not an index worker 0 of \d in shard 1 of 2", expected[0])
        assert list(it) == expected[1:]


@pytest.mark.timeout(30)
def test_bad_positions_and_versions_are_refused(no_leaks, setup):
    workers, loader, full, state = setup
    w = max(workers, 1)
    data = json.loads(state)
    seen0 = data["last_seen_indices"]["0"]
    per_worker = N * 2 // w  # two epochs
    cases = [
        (_edit(state, seen_0=seen0 - 10 * w), "out of range"),  # negative position
        (_edit(state, seen_0=-(10**30)), "out of range"),
        (_edit(state, seen_0=seen0 + (per_worker + 5) * w), "out of range"),
        (_edit(state, seen_0=10**30 * w), "out of range"),
        (_edit(state, seen_0="7"), "must be an int"),
        (_edit(state, seen_0=1.0), "must be an int"),
        (_edit(state, seen_0=None), "must be an int"),
        (_edit(state, last_seen_indices={}), "must map each worker"),
        (_edit(state, last_seen_indices=[0, 1]), "must map each worker"),
        (_edit(state, last_worker_index=w), "last_worker_index must be an int"),
        (_edit(state, last_worker_index=-2), "last_worker_index must be an int"),
        (_edit(state, last_worker_index="0"), "last_worker_index must be an int"),
        (_edit(state, version=3), "version 3 is not supported"),
        (_edit(state, version=10**6), "is not supported"),
        (_edit(state, version=0), "is not supported"),
        (_edit(state, version="2"), "is not supported"),
        (_edit(state, worker_count=str(workers)), "Worker count in checkpoint"),
        (_edit(state, worker_count=True if workers == 1 else None), "Worker count in checkpoint"),
    ]
    if w > 1:
        cases.append((_edit(state, seen_0=seen0 + 1), "is not an index worker 0"))
    with iter(loader) as it:
        it.set_state(state)
        for k, (bad, match) in enumerate(cases):
            _assert_refused(it, bad, match, full[5 + k])
        assert list(it) == full[5 + len(cases):]


# -- fuzzing ---------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _fuzz_loader():
    """A 2-worker loader whose workers never start: set_state only decodes.

    Made on first use, not at import: worker processes import this module to
    find ``Plus``.
    """
    return _loader(2)


@functools.lru_cache(maxsize=None)
def _valid(i):
    """Valid states of ``_fuzz_loader()``: what get_state() writes after 0, 1, 2 and 9 elements."""
    a, b, turn = [(0, 0, 0), (1, 0, 1), (1, 1, 0), (5, 4, 1)][i]
    loader = _fuzz_loader()
    return loader._encode(Positions([a, b], turn))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=6,
)


def _check_set_state(it, state):
    try:
        it.set_state(state)
    except (InvalidStateError, TypeError):
        return
    # Accepted: it must be a state this loader can write back and read again.
    again = it.get_state()
    it.set_state(again)
    assert it.get_state() == again


@pytest.mark.timeout(30)
@settings(max_examples=1200, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(st.binary(max_size=300) | st.text(max_size=300) | st.text(alphabet='{}[]":, 0123456789-eE.ntrufals', max_size=60).map(str.encode))
def test_fuzz_random_bytes_only_raise_documented_errors(data):
    it = iter(_fuzz_loader())
    _check_set_state(it, data)
    it.close()


@st.composite
def mutated_states(draw):
    state = _valid(draw(st.integers(0, 3)))
    kind = draw(st.integers(0, 4))
    if kind == 0:  # byte edits
        raw = bytearray(state)
        for _ in range(draw(st.integers(1, 4))):
            at = draw(st.integers(0, len(raw) - 1))
            op = draw(st.integers(0, 2))
            if op == 0:
                raw[at] = draw(st.integers(0, 255))
            elif op == 1:
                del raw[at]
            else:
                raw.insert(at, draw(st.integers(0, 255)))
        return bytes(raw)
    data = json.loads(state)
    if kind == 1:  # a field replaced by any JSON value
        key = draw(st.sampled_from(sorted(data) + ["extra"]))
        data[key] = draw(json_values)
    elif kind == 2:  # a field dropped
        data.pop(draw(st.sampled_from(sorted(data))))
    elif kind == 3:  # an index moved
        key = draw(st.sampled_from(sorted(data["last_seen_indices"]) + ["2", "-1", "00"]))
        data["last_seen_indices"][key] = draw(
            st.integers() | st.integers(-100, 100) | json_values
        )
    else:  # last worker / worker count / version moved
        key = draw(st.sampled_from(["last_worker_index", "worker_count", "version"]))
        data[key] = draw(st.integers(-3, 5) | st.integers() | json_values)
    return json.dumps(data).encode()


@pytest.mark.timeout(30)
@settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(mutated_states())
def test_fuzz_mutated_states_only_raise_documented_errors(state):
    it = iter(_fuzz_loader())
    _check_set_state(it, state)
    it.close()


@pytest.mark.timeout(30)
def test_fuzz_seeds_are_what_get_state_writes_and_restore(no_leaks):
    loader = _fuzz_loader()
    with iter(loader) as it:
        full = list(it)
    with iter(loader) as it:
        seen = []
        for _ in range(10):
            seen.append(it.get_state())
            next(it)
    assert [seen[k] for k in (0, 1, 2, 9)] == [_valid(i) for i in range(4)]
    with iter(loader) as it:
        next(it)
        for bad in (b"\x00", _valid(1)[:-3], b"{}", _edit(_valid(3), version=3)):
            with pytest.raises(InvalidStateError):
                it.set_state(bad)
        assert next(it) == full[1]
        it.set_state(_valid(3))
        assert list(it) == full[9:]
