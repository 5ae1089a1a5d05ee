from __future__ import annotations

from collections import Counter

from pdctl.router.upstream.pools import AffinityRing, HolderFirst, Pool, load_cap


def test_eject_after_consecutive_failures_and_readmit_on_success() -> None:
    pool = Pool("decode", ["http://a", "http://b"], eject_after=2)
    a = pool.members[0]
    pool.failed(a)
    assert a.healthy
    pool.succeeded(a)
    pool.failed(a)
    assert a.healthy  # the success reset the count
    pool.failed(a)
    assert not a.healthy and pool.healthy() == [pool.members[1]]
    pool.succeeded(a)
    assert a.healthy and a.failures == 0


def test_affinity_is_stable_and_spreads_conversations() -> None:
    pool = Pool("prefill", [f"http://p{i}" for i in range(4)])
    ring = AffinityRing(pool)
    picks = {f"conv-{i}": ring.pick(pool, f"conv-{i}") for i in range(400)}
    assert all(ring.pick(pool, k) is u for k, u in picks.items())
    share = Counter(u.url for u in picks.values() if u is not None)
    assert len(share) == 4 and min(share.values()) > 40


def test_affinity_moves_only_the_conversations_of_an_ejected_instance() -> None:
    pool = Pool("prefill", [f"http://p{i}" for i in range(3)])
    ring = AffinityRing(pool)
    before = {k: ring.pick(pool, k) for k in (f"c{i}" for i in range(300))}
    pool.members[0].healthy = False
    after = {k: ring.pick(pool, k) for k in before}
    moved = [k for k in before if before[k] is not after[k]]
    assert moved and all(before[k] is pool.members[0] for k in moved)


def test_affinity_respects_the_load_cap() -> None:
    pool = Pool("prefill", ["http://p0", "http://p1"])
    ring = AffinityRing(pool, factor=1.25)
    home = ring.pick(pool, "hot")
    assert home is not None
    home.outstanding = 10
    away = ring.pick(pool, "hot")
    assert away is not home and load_cap(pool.members, 1.25) == 7


def test_decode_prefers_the_holder_under_the_cap_else_least_loaded() -> None:
    pool = Pool("decode", ["http://d0", "http://d1", "http://d2"])
    policy = HolderFirst(1.25)
    d0, d1, d2 = pool.members
    assert policy.pick(pool, "http://d1") is d1
    d0.outstanding = d1.outstanding = d2.outstanding = 1
    assert policy.pick(pool, "http://d1") is d1  # cap = ceil(1.25 * 4 / 3) = 2
    d1.outstanding = 5
    assert policy.pick(pool, "http://d1") in (d0, d2)
    d0.outstanding = 3
    assert policy.pick(pool, "http://d1") is d2
    assert policy.pick(pool, "", exclude=[d2]) is d0
    d1.healthy = False
    assert policy.pick(pool, "http://d1", exclude=[d0, d2]) is None


def test_idle_decodes_share_new_conversations() -> None:
    pool = Pool("decode", ["http://d0", "http://d1"])
    policy = HolderFirst()
    got = Counter(policy.pick(pool, "").url for _ in range(10))  # type: ignore[union-attr]
    assert got == {"http://d0": 5, "http://d1": 5}


def test_slowness_never_ejects_the_last_healthy_instance_but_a_dead_one_goes() -> None:
    pool = Pool("decode", ["http://a", "http://b"], eject_after=2)
    a, b = pool.members
    for _ in range(2):
        pool.failed(a, slow=True)
    assert not a.healthy  # another instance is left: a slow one may go
    for _ in range(5):
        pool.failed(b, slow=True)
    assert b.healthy and pool.healthy() == [b]  # the last one stays for timeouts...
    pool.failed(b)
    assert not b.healthy  # ...but not for a refused connection


def test_ejection_a_loss_or_a_new_engine_id_starts_a_new_generation() -> None:
    pool = Pool("decode", ["http://a"], eject_after=3)
    a = pool.members[0]
    pool.saw_engine(a, "engine-1")
    assert a.generation == 0
    pool.saw_engine(a, "engine-1")
    assert a.generation == 0
    pool.saw_engine(a, "engine-2")
    assert a.generation == 1 and a.engine_id == "engine-2"
    pool.lost(a)
    assert a.generation == 2
    pool.eject(a)
    assert a.generation == 3 and not a.healthy
